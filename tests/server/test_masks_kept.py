"""The masks a process keeps hold only each type's current registration: a type registered again many
times (agents of two versions re-registering at each start) must not keep every earlier registration's
descriptor pool alive through the masks compiled against it."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from ckpt.sidecar import Store, StoreConfig
from ckpt.sidecar.server.masking import Masks
from tests.support import AGENT_STATE, agent_file, agent_state_class, agent_step, descriptor_set_of


def test_masks_of_an_earlier_registration_of_a_type_are_let_go(tmp_path: Path) -> None:
    with Store(StoreConfig(data_dir=tmp_path / "data")) as store:
        masks = Masks(store)
        state_class = agent_state_class(agent_file(summary=True))
        store.register_types(descriptor_set_of(agent_file(summary=True)))
        store.put("typed", agent_step(state_class, 1).SerializeToString(), message_type=AGENT_STATE)
        earlier: list[weakref.ref[type]] = []
        for generation in range(6):
            renamed = agent_file(summary=True)
            renamed.message_type[1].field[-1].name = f"notes{generation}"
            store.register_types(descriptor_set_of(renamed))
            for paths in ([f"notes{generation}"], [f"notes{generation}", "last"]):
                got = masks.masked("typed", store.get("typed"), paths)
                assert got.info.message_type == AGENT_STATE
            current = store.current_message_class(AGENT_STATE)
            assert current is not None
            earlier.append(weakref.ref(current))
            del current
        gc.collect()
        kept = {id(mask.message_type) for mask in masks._compiled.values()}
        assert len(masks._compiled) == 2 and len(kept) == 1
        assert [ref() is None for ref in earlier[:-1]] == [True] * 5
