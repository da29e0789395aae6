"""The training state: one caller-owned buffer holding every tensor a training step changes.

Each tensor (a parameter, an optimizer moment, the step counter, a running statistic) has a fixed
64-byte-aligned offset. NAME_run reads the parameters from it and NAME_train_step updates it in place,
so a library trains and serves from one buffer with no copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ALIGN = 64

ROLES = ("parameter", "moment", "step", "running statistic", "hyperparameter")


@dataclass
class StateSlot:
    name: str
    role: str                  # one of ROLES
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int
    init: np.ndarray | None    # the initial value NAME_state_init writes; None: zeros

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class StateLayout:
    slots: list[StateSlot] = field(default_factory=list)
    nbytes: int = 0

    def add(self, name: str, role: str, shape: tuple[int, ...], dtype: np.dtype,
            init: np.ndarray | None = None) -> StateSlot:
        assert role in ROLES, role
        taken = {s.name for s in self.slots}
        base, i = name, 1
        while name in taken:  # a moment's or the step counter's name may be a parameter's
            i += 1
            name = f"{base}.{i}"
        slot = StateSlot(name, role, tuple(int(d) for d in shape), np.dtype(dtype), self.nbytes,
                         None if init is None else np.ascontiguousarray(init, dtype=dtype))
        self.slots.append(slot)
        self.nbytes += -(-max(slot.nbytes, 1) // ALIGN) * ALIGN
        return slot

    def metadata(self) -> dict:
        """What NAME.json records: the bindings map the state through it."""
        return {"bytes": self.nbytes,
                "tensors": [{"name": s.name, "role": s.role, "shape": list(s.shape),
                             "dtype": np.dtype(s.dtype).name, "offset": s.offset} for s in self.slots]}
