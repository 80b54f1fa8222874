"""The backend's cached group shape (``_backend._group_shape``): a group's size and this process's rank are asked
of ``torch.distributed`` once per group object, and a group made after the first one was destroyed is asked anew
(its id may be the destroyed group's). Not being a member is never cached (``test_collectives`` checks the error).
"""

from __future__ import annotations

import pytest
import torch.distributed as dist

from tests._helpers.harness import free_port
from torchmetrics_diff.distributed import _backend

pytestmark = pytest.mark.timeout(60)


def _init() -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)


def test_a_groups_shape_is_asked_once_and_again_for_a_new_group(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    real_size, real_rank = dist.get_world_size, dist.get_rank
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: asked.append("size") or real_size(group))
    monkeypatch.setattr(dist, "get_rank", lambda group=None: asked.append("rank") or real_rank(group))
    assert _backend.group_size() == 1 and asked == [], "not distributed: nothing to ask"
    _init()
    try:
        assert (_backend.group_size(), _backend.group_rank()) == (1, 0)
        assert asked == ["size", "rank"], f"the first call asks torch.distributed: {asked}"
        for _ in range(3):
            assert (_backend.group_size(None), _backend.group_rank(dist.group.WORLD)) == (1, 0)
        assert asked == ["size", "rank"], f"the same group (None or the WORLD object) is not asked again: {asked}"
    finally:
        dist.destroy_process_group()
    assert _backend.group_size() == 1 and _backend.group_rank() == 0, "destroyed: not distributed any more"
    assert asked == ["size", "rank"], f"{asked}"
    _init()
    try:
        assert _backend.group_size() == 1
        assert asked == ["size", "rank", "size", "rank"], f"a new default group is asked anew: {asked}"
    finally:
        dist.destroy_process_group()
