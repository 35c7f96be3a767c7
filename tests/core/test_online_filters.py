"""The run's ``curation`` takes online filters; anything else is refused before any work."""

from __future__ import annotations

import pytest

from rlax.core.errors import ConfigError
from rlax.core.rollout.groups import check_online_filters
from rlax.core.spec import RunSpec
from rlax.core.spec.checks import check_run
from rlax.core.spec.rules import check_curation
from rlax.plugins.curation.dedup import Dedup
from rlax.plugins.curation.zero_variance import ZeroVarianceFilter


class NoFilter:
    pass


def test_online_filters_pass_and_others_are_named_with_their_place():
    check_online_filters([ZeroVarianceFilter()], "rlax.run.curation")  # no error
    with pytest.raises(ConfigError) as err:
        check_online_filters([ZeroVarianceFilter(), Dedup()], "rlax.run.curation")
    assert str(err.value) == (
        "rlax.run.curation[1]: Dedup has no online(groups) (an offline filter: run it with "
        "`rlax curate`); curation here takes online filters"
    )
    with pytest.raises(
        ConfigError,
        match=r"^rlax.run.curation\[0\]: NoFilter has no "
        r"online\(groups\); curation",
    ):
        check_online_filters([NoFilter()], "rlax.run.curation")


@pytest.mark.parametrize("role", ["all", "inline", "trainer", "worker", "param_server", "eval"])
def test_the_run_s_curation_takes_online_filters_only_for_every_role(tmp_path, role):
    # Checked on the whole specification before any work: the checkpoint does not exist,
    # and had the check got that far, the error would name it.
    spec = RunSpec(
        task=None,
        reward=None,
        sampler=None,
        init_checkpoint=str(tmp_path / "missing"),
        curation=[ZeroVarianceFilter(), Dedup()],
    )
    with pytest.raises(ConfigError) as err:
        check_run(spec, role)
    assert str(err.value) == (
        "rlax.run.curation[1]: Dedup has no online(groups) (an offline filter: run it with "
        "`rlax curate`); curation here takes online filters"
    )
    check_curation(spec.replace(curation=[ZeroVarianceFilter()]), role)  # online only: no error
