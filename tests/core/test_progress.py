"""The trainer loop's progress where the output is not a terminal: a line every N steps."""

from __future__ import annotations

import io

from tqdm import tqdm

from rlax.core.trainer.observe import WatchSettings
from rlax.core.trainer.progress import PipeProgress, progress_bar

PHASES = ("waiting for rollouts", "training", "publishing", "checkpoint")


def drive(bar, rewards):
    """What the loop does per step: names every phase, then hands over the step's figures."""
    for step in bar:
        for phase in PHASES:
            bar.set_description_str(f"rl [{phase}]")
        bar.set_postfix(reward=f"{rewards[step]:.2f}", queue=step % 3, refresh=False)


def test_a_pipe_gets_one_line_every_n_steps_and_the_last_not_one_per_phase():
    out = io.StringIO()  # not a terminal, like a log file or a pipe
    bar = progress_bar(range(1, 26), total=25, show=True, every=10, stream=out)
    assert isinstance(bar, PipeProgress)
    drive(bar, {s: s / 100 for s in range(1, 26)})
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 3  # steps 10, 20 and the last, 25
    assert [line.split(" [")[0] for line in lines] == ["rl 10/25", "rl 20/25", "rl 25/25"]
    assert lines[0].endswith("reward=0.10, queue=1")  # step 10's own figures
    assert lines[2].endswith("reward=0.25, queue=1")


def test_a_resumed_run_counts_from_its_step_and_zero_means_the_last_line_only():
    out = io.StringIO()
    drive(progress_bar(range(31, 41), total=40, show=True, every=10, stream=out), [0.5] * 41)
    assert [line.split(" [")[0] for line in out.getvalue().splitlines()] == ["rl 40/40"]
    out = io.StringIO()
    drive(progress_bar(range(1, 8), total=7, show=True, every=0, stream=out), [0.5] * 8)
    assert [line.split(" [")[0] for line in out.getvalue().splitlines()] == ["rl 7/7"]


def test_a_terminal_gets_the_bar_and_progress_off_writes_nothing():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(
        progress_bar(range(1, 3), total=2, show=True, every=10, stream=Terminal()), tqdm
    )
    out = io.StringIO()
    drive(progress_bar(range(1, 4), total=3, show=False, every=1, stream=out), [0.0] * 4)
    assert out.getvalue() == ""


def test_the_default_is_a_line_every_ten_steps():
    assert WatchSettings().progress_every == 10
