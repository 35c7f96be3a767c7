"""Multi-turn environments, tool-call parsers and the episode sampler (docs/environments.md).

An environment (:class:`rlax.core.contracts.Environment`) answers each model
turn with an observation; :mod:`.runner` plays the episodes token in, token
out, behind the ordinary Sampler contract, so workers, the inline trainer and
the evaluation run them unchanged.
"""
