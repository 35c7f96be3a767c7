"""The run's memory bound without a cgroup: init's watch over its namespace's ``/proc``.

The end-to-end case (a hostile program of four 230 MB processes, killed) is in
``hostile/test_hostile.py``; here the counting rule, on a ``/proc`` made by hand.
"""

from __future__ import annotations

import os
import shutil

from rlax.plugins.rewards.sandbox.cgroup import ResidentWatch

MB = 2**20


def fake_proc(root, processes: dict[str, tuple[int, int | None]]) -> str:
    """``{pid: (resident MB, Pss MB or None for an unreadable smaps_rollup)}`` as /proc."""
    page = os.sysconf("SC_PAGE_SIZE")
    for pid, (resident, pss) in processes.items():
        (root / pid).mkdir()
        (root / pid / "statm").write_text(f"999 {resident * MB // page} 0 0 0 0 0\n")
        if pss is not None:
            rollup = f"Rss: {resident * 1024} kB\nPss: {pss * 1024} kB\nPss_Anon: 0 kB\n"
            (root / pid / "smaps_rollup").write_text(rollup)
        else:  # a read that fails (as root, a mode would not stop it)
            (root / pid / "smaps_rollup").mkdir()
    (root / "self").mkdir()  # not a process folder
    (root / "meminfo").write_text("MemTotal: 1 kB\n")
    return str(root)


def test_under_the_bound_by_resident_memory_alone(tmp_path):
    watch = ResidentWatch(512, fake_proc(tmp_path, {"1": (12, 12), "7": (200, 150)}))
    assert not watch.over()
    assert watch.peak_bytes == 212 * MB  # resident sum: proportional is not read


def test_shared_pages_count_once_past_the_resident_sum(tmp_path):
    # four forks of one interpreter: 150 MB resident each, mostly shared (Pss 60 each)
    proc = fake_proc(tmp_path, {str(p): (150, 60) for p in (1, 2, 3, 4)})
    watch = ResidentWatch(512, proc)
    assert not watch.over()  # 600 MB resident, 240 MB proportional: under
    assert watch.peak_bytes == 240 * MB


def test_past_the_bound_it_stays_exceeded(tmp_path):
    proc = fake_proc(tmp_path, {str(p): (230, 230) for p in (2, 3, 4)})
    watch = ResidentWatch(512, proc)
    assert watch.over() and watch.exceeded and watch.peak_bytes == 690 * MB
    for p in (2, 3, 4):  # killed: gone from /proc
        shutil.rmtree(tmp_path / str(p))
    assert watch.over() and watch.peak_bytes == 690 * MB


def test_an_unreadable_share_leaves_the_resident_sum_to_decide(tmp_path):
    watch = ResidentWatch(512, fake_proc(tmp_path, {"2": (300, 100), "3": (300, None)}))
    assert watch.over() and watch.peak_bytes == 600 * MB


def test_a_process_gone_between_listing_and_reading_counts_nothing(tmp_path):
    proc = fake_proc(tmp_path, {"2": (100, 100)})
    (tmp_path / "9").mkdir()  # listed, its files already gone
    watch = ResidentWatch(512, proc)
    assert not watch.over() and watch.peak_bytes == 100 * MB
