"""The policy: building the tiny default model, the chat format, and generation backends."""
