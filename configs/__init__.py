"""The gin files that ship with rlax, in one folder per layer (t5x's layers):

- ``base/``: the wiring of every role (``roles.gin``) and the optimiser (``optimizer.gin``);
- ``algorithms/``: one file per algorithm, its own bindings only (``grpo.gin`` also
  brings the optimiser, as it always has);
- ``tasks/``: a task with its reward and sampler (``arithmetic.gin``, ``gsm8k_tiny.gin``);
- ``models/``: a starting policy (``quickstart_base.gin``, ``smollm2.gin``);
- ``experiments/``: what ``rlax run --gin NAME`` runs, each a few includes of the
  others and its own numbers (``quickstart.gin``, ``dapo.gin``: the quickstart with
  ``algorithms/dapo.gin``).

``rlax run --gin NAME`` finds ``experiments/NAME.gin``, else the one file called
``NAME.gin`` in the other folders; ``FOLDER/NAME`` (``algorithms/dapo``) names any
file (``rlax.core.config.finder``). Paths written in these files (``INIT_CHECKPOINT``,
a task's data files) are relative to the folder of the file that writes them, so the
packaged configs find the packaged assets (``../../assets``) wherever rlax is installed.
"""
