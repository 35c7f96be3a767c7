"""Built-in critics: a value head on the policy's trunk, a value model with its own trunk.

Each module is a plugin (``rlax_register_critics``) whose component is a
:class:`rlax.core.contracts.Critic`; the modules they build are those of
:mod:`rlax.core.models.critic`, so their parameter trees, and so the
checkpoints of runs with a critic, are the ones the trainer always had.
"""
