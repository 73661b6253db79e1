"""The measured path: experiment config and grid → launch (one torchrun rank group per run) → worker."""
