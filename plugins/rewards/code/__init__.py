"""The code reward (``rewards.code``): a solution run against a task's tests in the sandbox.

``plan`` reads the tests, ``sandboxed`` runs the solution on their inputs
(through :mod:`rlax.plugins.rewards.sandbox`, with ``harness.py`` inside), and
``verdict`` judges its outputs here, on the wire form of ``values``
(``equality``); ``verifier`` is the plugin.
"""
