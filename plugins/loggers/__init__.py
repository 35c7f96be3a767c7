"""Built-in loggers: TensorBoard event files and Weights & Biases runs (docs/observability.md).

Each module is a plugin (``rlax_register_loggers``) whose third-party library
is imported only when a run opens the logger, so rlax installs and runs
without them (``pip install 'rlax-llm[observe]'`` adds them).
"""
