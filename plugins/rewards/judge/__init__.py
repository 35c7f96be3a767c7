"""The judge reward (``rewards.judge``): a grader model scores a completion with a rubric.

``client`` asks the grader (deadlines, retries), ``verdict`` parses its answer
strictly, ``cache`` keeps each judgement once; ``reward`` is the plugin.
"""
