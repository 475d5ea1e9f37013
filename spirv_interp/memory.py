"""Memory objects (storage buffers, workgroup variables, push constants) and the checks
the Vulkan memory model asks of the accesses to them.

Every object is bytes. Explicitly laid out storage follows its Offset / ArrayStride
decorations; Workgroup arrays are tightly packed, and cooperative-matrix loads and stores
address "contiguous locations" from their pointer in units of the pointee type, so a
matrix of float16 may be read out of an array of uvec4 as SPV_KHR_cooperative_matrix allows.

Because the interpreter runs many invocations in lockstep, a missing barrier would go
unnoticed by the results alone. So every byte of a writable object remembers who last
wrote it, when (its barrier interval: the `epoch`), whether and when the write was made
available, and who read it in the current interval. Then (Vulkan memory model, appendix
"Memory Model"):
- two accesses by different invocations, at least one a write, in the same interval of a
  Workgroup object, or anywhere in the dispatch for a storage buffer (the kernels' barriers
  order workgroup memory only), are a data race;
- a read of another invocation's write needs the write to be non-private and made
  available (MakePointerAvailable on the store, or a barrier with MakeAvailable after it),
  then made visible to the reader (MakePointerVisible on the load, or a barrier with
  MakeVisible), each at a scope that holds both invocations, and a barrier with acquire
  and release semantics for workgroup memory between them (that is what ends an interval).
A cooperative-matrix access is made by "some implementation-dependent invocation(s)" of the
subgroup (appendix "Cooperative Matrix Memory Access"), so it counts as a different
invocation from every other access, including the same subgroup's.
"""

from __future__ import annotations

import numpy as np

from .module import UndefinedBehavior
from .spec import WORKGROUP_OR_WIDER, Scope, StorageClass

NOBODY = -1
SEVERAL = -2  # read by more than one invocation in the interval
NEVER = np.iinfo(np.int32).max  # a write that is never made available (a private write)
COOP_OWNER = 1 << 40  # owners at or above this are "some invocation of subgroup (o - COOP)"
# Scope values whose instance holds a whole workgroup (indexable by scope + 1, so -1 for
# "none" maps to False).
_WIDE = np.zeros(8, bool)
_WIDE[[s + 1 for s in WORKGROUP_OR_WIDER]] = True


class DataRace(UndefinedBehavior):
    pass


class Memory:
    def __init__(self, name: str, storage: int, size: int, *, writable: bool,
                 readable: bool = True, init: np.ndarray | None = None, fill: int = 0xFF,
                 track: bool = True) -> None:
        self.name, self.storage, self.size = name, storage, size
        self.writable, self.readable = writable, readable
        # Padded so that any scalar dtype can view it whole.
        self.data = np.full(-(-max(size, 1) // 16) * 16, fill, np.uint8)
        if init is not None:
            self.data[:size] = init
        self._views: dict[np.dtype, np.ndarray] = {}
        self.track = track and writable
        if self.track:
            self.w_owner = np.full(size, NOBODY, np.int64)
            self.w_epoch = np.full(size, -1, np.int32)
            self.w_avail_epoch = np.full(size, NEVER, np.int32)
            self.w_avail_scope = np.full(size, -1, np.int8)
            self.w_private = np.zeros(size, bool)
            self.r_owner = np.full(size, NOBODY, np.int64)
            self.r_epoch = np.full(size, -1, np.int32)
        # Elements written by OpStore and by cooperative-matrix stores (for tests that
        # want to know which path a kernel took).
        self.stored = {"scalar": 0, "matrix": 0}
        self.epoch = 0
        self.visible_barriers: list[tuple[int, int]] = []  # (epoch it starts, scope)

    def __repr__(self) -> str:
        return f"{StorageClass(self.storage).name} {self.name!r}"

    def view(self, dt: np.dtype) -> np.ndarray:
        v = self._views.get(dt)
        if v is None:
            v = self._views[dt] = self.data.view(dt)
        return v

    def check_bounds(self, offsets: np.ndarray, nbytes: int) -> None:
        if offsets.size and (offsets.min() < 0 or offsets.max() + nbytes > self.size):
            bad = offsets[(offsets < 0) | (offsets + nbytes > self.size)]
            raise UndefinedBehavior(f"access outside {self} ({self.size} bytes) at byte "
                                    f"offset {int(bad[0])}")

    def read(self, offsets: np.ndarray, dt: np.dtype) -> np.ndarray:
        """Elements of dtype dt at byte offsets (any shape); offsets must be aligned."""
        if not self.readable:
            raise UndefinedBehavior(f"read from {self}, whose members are all NonReadable")
        self.check_bounds(offsets, dt.itemsize)
        if offsets.size and np.any(offsets % dt.itemsize):
            raise UndefinedBehavior(f"misaligned {dt} access to {self}")
        return self.view(dt)[offsets // dt.itemsize]

    def write(self, offsets: np.ndarray, values: np.ndarray, dt: np.dtype) -> None:
        if not self.writable:
            raise UndefinedBehavior(f"write to read-only {self}")
        self.check_bounds(offsets, dt.itemsize)
        if offsets.size and np.any(offsets % dt.itemsize):
            raise UndefinedBehavior(f"misaligned {dt} access to {self}")
        self.view(dt)[offsets // dt.itemsize] = values

    # -- the memory model ---------------------------------------------------------------
    def _same(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Whether accesses by owners a and b are by one invocation (program order)."""
        return (a == b) & (a < COOP_OWNER)

    def _subgroup(self, owner: np.ndarray, subgroup_size: int) -> np.ndarray:
        return np.where(owner >= COOP_OWNER, owner - COOP_OWNER, owner // subgroup_size)

    def _scope_ok(self, scope: np.ndarray, a: np.ndarray, b: np.ndarray,
                  subgroup_size: int) -> np.ndarray:
        """Whether a scope (per byte) includes both owners."""
        wide = _WIDE[scope.astype(np.int64) + 1]
        same_sub = self._subgroup(a, subgroup_size) == self._subgroup(b, subgroup_size)
        return wide | (same_sub & (scope == Scope.Subgroup))

    def on_read(self, byte_offsets: np.ndarray, owners: np.ndarray, visible_scope: int | None,
                non_private: bool, subgroup_size: int) -> None:
        """byte_offsets (n, k): the bytes of n accesses; owners (n,); visible_scope: the
        scope of the load's MakePointerVisible (None: the load has none)."""
        if not self.track:
            return
        idx = byte_offsets.reshape(-1)
        own = np.broadcast_to(owners[:, None], byte_offsets.shape).reshape(-1)
        w_owner = self.w_owner[idx]
        foreign = (w_owner != NOBODY) & ~self._same(w_owner, own)
        if foreign.any():
            if not non_private:
                raise UndefinedBehavior(f"{self}: a private load (no NonPrivatePointer) reads "
                                        f"byte {int(idx[foreign][0])} written by another "
                                        "invocation")
            self._check_communication(idx[foreign], own[foreign], visible_scope, subgroup_size)
        # Remember the reader for write-after-read checks.
        current = self.r_epoch[idx] == self.epoch
        prev = np.where(current, self.r_owner[idx], NOBODY)
        merged = np.where((prev == NOBODY) | self._same(prev, own), own, SEVERAL)
        merged = np.where(own >= COOP_OWNER, SEVERAL, merged)
        self.r_owner[idx] = merged
        self.r_epoch[idx] = self.epoch
        clash = self.r_owner[idx] != merged  # two readers of one byte in this access
        if clash.any():
            self.r_owner[idx[clash]] = SEVERAL

    def _check_communication(self, idx: np.ndarray, own: np.ndarray, visible_scope: int | None,
                             subgroup_size: int) -> None:
        writer = self.w_owner[idx]
        w_epoch = self.w_epoch[idx]
        racing = w_epoch >= self.epoch
        if racing.any():
            raise DataRace(f"{self}: byte {int(idx[racing][0])} written by "
                           f"{_who(writer[racing][0])} and read by {_who(own[racing][0])} "
                           "with no barrier between them")
        avail_epoch = self.w_avail_epoch[idx]
        avail_ok = (avail_epoch <= self.epoch) & self._scope_ok(
            self.w_avail_scope[idx], writer, own, subgroup_size)
        if not avail_ok.all():
            raise UndefinedBehavior(f"{self}: byte {int(idx[~avail_ok][0])} is read by "
                                    "another invocation but its write was never made "
                                    "available to it (MakePointerAvailable/NonPrivatePointer "
                                    "or a barrier with MakeAvailable)")
        if visible_scope is not None:
            vis_ok = self._scope_ok(np.full(idx.shape, visible_scope, np.int8), writer, own,
                                    subgroup_size)
        else:
            vis_ok = np.zeros(idx.shape, bool)
        for start, scope in self.visible_barriers:  # barriers with MakeVisible
            vis_ok |= (avail_epoch <= start) & (start <= self.epoch) & self._scope_ok(
                np.full(idx.shape, scope, np.int8), writer, own, subgroup_size)
        if not vis_ok.all():
            raise UndefinedBehavior(f"{self}: byte {int(idx[~vis_ok][0])}, written by another "
                                    "invocation, is read without being made visible "
                                    "(MakePointerVisible/NonPrivatePointer or a barrier with "
                                    "MakeVisible)")

    def on_write(self, byte_offsets: np.ndarray, owners: np.ndarray, available_scope: int | None,
                 non_private: bool) -> None:
        """available_scope: the scope of the store's MakePointerAvailable (None: none)."""
        if not self.track:
            return
        idx = byte_offsets.reshape(-1)
        own = np.broadcast_to(owners[:, None], byte_offsets.shape).reshape(-1)
        w_owner = self.w_owner[idx]
        race = (w_owner != NOBODY) & (self.w_epoch[idx] >= self.epoch) & ~self._same(w_owner,
                                                                                    own)
        r_owner = self.r_owner[idx]
        race_r = (r_owner != NOBODY) & (self.r_epoch[idx] >= self.epoch) & ~self._same(
            r_owner, own)
        if race.any() or race_r.any():
            bad = race | race_r
            other = np.where(race, w_owner, r_owner)[bad][0]
            raise DataRace(f"{self}: byte {int(idx[bad][0])} written by "
                           f"{_who(own[bad][0])} and {'written' if race[bad][0] else 'read'} "
                           f"by {_who(other)} with no barrier between them")
        self.w_owner[idx] = own
        # Two invocations storing to one byte in one instruction. (A cooperative-matrix
        # store whose elements overlap is refused where it is decoded.)
        if np.any(self.w_owner[idx] != own):
            raise DataRace(f"{self}: one instruction stores twice to a byte")
        self.w_epoch[idx] = self.epoch
        if available_scope is not None and non_private:
            self.w_avail_epoch[idx] = self.epoch
            self.w_avail_scope[idx] = available_scope
        else:
            self.w_avail_epoch[idx] = NEVER
            self.w_avail_scope[idx] = -1
        self.w_private[idx] = not non_private
        self.r_owner[idx] = NOBODY

    def barrier(self, semantics_orders: bool, make_available: bool, make_visible: bool,
                scope: int) -> None:
        """A control barrier executed by the whole workgroup."""
        if not self.track or not semantics_orders:
            return
        if make_available:
            # Private writes take part in no availability operation.
            fresh = (self.w_owner != NOBODY) & (self.w_avail_epoch == NEVER) & ~self.w_private
            self.w_avail_epoch[fresh] = self.epoch + 1
            self.w_avail_scope[fresh] = scope
        self.epoch += 1
        if make_visible:
            self.visible_barriers.append((self.epoch, scope))


def _who(owner: int) -> str:
    owner = int(owner)
    if owner == SEVERAL:
        return "several invocations"
    if owner >= COOP_OWNER:
        return f"a cooperative-matrix access of subgroup {owner - COOP_OWNER}"
    return f"invocation {owner}"
