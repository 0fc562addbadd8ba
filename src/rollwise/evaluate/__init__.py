"""Evaluation: held-out success with intervals, reports and plots."""
