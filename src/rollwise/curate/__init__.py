"""Curation: decide which failures may teach (attribution, filters, the success bank)."""
