"""The JAX-free roles' record of themselves (rlax.core.runtime.jax_free): what a process
records is whether it had imported JAX when it recorded."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlax.core.runtime.jax_free import record_jax_free
from rlax.core.runtime.run_dir import RunDir

# Records once before importing JAX (as the parameter server) and once after (as the
# supervisor), in one fresh process.
BEFORE_AND_AFTER = """
import sys
from rlax.core.runtime.jax_free import record_jax_free
print(record_jax_free(sys.argv[1], "param_server"))
import jax
print(record_jax_free(sys.argv[1], "supervisor"))
"""


def test_the_record_says_whether_the_process_had_imported_jax(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", BEFORE_AND_AFTER, str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "True"]
    records = {p.name: json.loads(p.read_text()) for p in (tmp_path / RunDir.PROCESSES).iterdir()}
    pid = next(iter(records.values()))["pid"]
    assert {name: r["jax_imported"] for name, r in records.items()} == {
        f"param_server-{pid}.json": False,
        f"supervisor-{pid}.json": True,
    }


def test_without_a_run_directory_nothing_is_written_and_other_roles_promise_nothing(tmp_path):
    assert record_jax_free(None, "param_server") == ("jax" in sys.modules)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="role 'trainer' makes no promise about JAX"):
        record_jax_free(tmp_path, "trainer")
