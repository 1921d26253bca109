"""The Auto Scaling group provider through real boto3 against moto's server behind the test's front."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.aws.fake_aws import MotoServer
from tests.aws.harness import Harness, run, settle

pytestmark = pytest.mark.xdist_group("moto")  # the worker whose moto is warm (make test: --dist loadgroup)


def test_fills_the_group_to_the_level_and_lists_instances_by_id(moto_server: MotoServer, tmp_path: Path) -> None:
    async def scenario(h: Harness) -> None:
        provider = h.provider(slots_per_instance=2)
        assert await provider.list_instances() == frozenset()
        await provider.request_capacity(5)
        await provider.list_instances()
        await settle(provider)
        names = await provider.list_instances()
        assert names == h.fake.names() and len(names) == 3
        assert all(n.startswith("i-") for n in names)
        assert h.kinds() == ["ProviderScaleOut", "ProviderScaleOutDone"]
        await provider.list_instances()
        await settle(provider)
        assert len(h.fake.mutations()) == 1

    run(moto_server, tmp_path, scenario)
