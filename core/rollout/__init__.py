"""Prompts -> scored groups, shared by the worker, the trainer, evaluation and the parameter server."""
