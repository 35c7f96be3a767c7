"""A role's ``curation`` takes online filters; anything else is refused before any work."""

from __future__ import annotations

import pytest

from rlax.core.errors import ConfigError
from rlax.core.rollout.groups import check_online_filters
from rlax.core.trainer.role import train
from rlax.core.worker.role import worker
from rlax.plugins.curation.dedup import Dedup
from rlax.plugins.curation.zero_variance import ZeroVarianceFilter


class NoFilter:
    pass


def test_online_filters_pass_and_others_are_named_with_their_place():
    check_online_filters([ZeroVarianceFilter()], "rlax.train.curation")  # no error
    with pytest.raises(ConfigError) as err:
        check_online_filters([ZeroVarianceFilter(), Dedup()], "rlax.train.curation")
    assert str(err.value) == (
        "rlax.train.curation[1]: Dedup has no online(groups) (an offline filter: run it with "
        "`rlax curate`); curation here takes online filters"
    )
    with pytest.raises(
        ConfigError,
        match=r"^rlax.worker.curation\[0\]: NoFilter has no "
        r"online\(groups\); curation",
    ):
        check_online_filters([NoFilter()], "rlax.worker.curation")


def test_the_trainer_refuses_an_offline_filter_before_it_loads_the_model(tmp_path):
    # The checkpoint does not exist: had the trainer got that far, the error would name it.
    with pytest.raises(ConfigError, match=r"^rlax.train.curation\[0\]: Dedup"):
        train(
            task=None,
            reward=None,
            sampler=None,
            algorithm=None,
            optimizer=None,
            init_checkpoint=str(tmp_path / "missing"),
            curation=[Dedup()],
            run_dir=tmp_path / "run",
        )
    assert not (tmp_path / "run").exists()


def test_a_worker_refuses_an_offline_filter_before_it_loads_the_model(tmp_path):
    with pytest.raises(ConfigError, match=r"^rlax.worker.curation\[0\]: Dedup"):
        worker(
            sampler=None,
            reward=None,
            init_checkpoint=str(tmp_path / "missing"),
            settings=None,
            curation=[Dedup()],
        )
