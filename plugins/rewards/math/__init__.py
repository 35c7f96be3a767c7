"""The math reward (``rewards.math``): the final answer extracted and compared with the reference.

``extraction`` finds the answer, ``equivalence`` compares it (``numbers`` exactly
as rationals first), each comparison within ``deadline``; ``verifier`` is the plugin.
"""
