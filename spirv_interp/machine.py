"""Executing a compute entry point, one workgroup at a time.

A *wave* is a set of whole subgroups executed in lockstep: every SSA value holds one
entry per invocation (numpy, vectorised over the invocations; a value that no invocation
can tell apart, such as a constant or a push constant, stays a single entry), and a
cooperative matrix holds one matrix per subgroup, since the subgroup owns it as a whole.
By default a workgroup is one wave; with lockstep="subgroup" each subgroup is a wave of
its own, run as a generator up to each OpControlBarrier, so the subgroups interleave
only at barriers, in a fixed order.

Control flow follows the structured constructs (OpSelectionMerge, OpLoopMerge): where a
branch splits the invocations, each side runs with its own mask up to the merge block;
a loop runs until no invocation is left in it. The instructions that the specification
calls tangled (cooperative-matrix loads, stores, multiply-adds, arithmetic and
conversions on matrices) must run with each subgroup entirely active or inactive, and a
workgroup barrier with the whole workgroup active; anything else is reported as
undefined behavior, as are data races and missing availability/visibility (memory.py),
accesses outside a buffer or array, division by zero and out-of-range shifts.

The instruction handlers are in one table, HANDLERS (opcode -> function); an opcode
without an entry is refused when the module is loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .memory import COOP_OWNER, Memory
from .module import (
    ArrayT,
    Block,
    BoolT,
    CoopMatT,
    FloatT,
    Ins,
    InterpreterError,
    IntT,
    Module,
    PointerT,
    RuntimeArrayT,
    StructT,
    Type,
    UndefinedBehavior,
    Unsupported,
    VectorT,
    VoidT,
    element_stride,
    int_dtype,
    is_fp8,
    lane_ndim,
    np_dtype,
    scalar_of,
    type_size,
)
from .spec import (
    WORKGROUP_OR_WIDER,
    BuiltIn,
    CooperativeMatrixLayout,
    CooperativeMatrixOperands,
    CooperativeMatrixUse,
    Decoration,
    ExecutionModel,
    FPEncoding,
    MemoryAccess,
    MemorySemantics,
    Op,
    Scope,
    StorageClass,
)

MAX_BLOCKS = 5_000_000  # executed blocks per wave before we call it an endless loop


class Mask:
    """The active invocations of a wave."""

    __slots__ = ("lanes", "count", "full")

    def __init__(self, lanes: np.ndarray) -> None:
        self.lanes = lanes
        self.count = int(np.count_nonzero(lanes))
        self.full = self.count == lanes.size

    def __or__(self, other: Mask) -> Mask:
        return Mask(self.lanes | other.lanes)


@dataclass
class Local:
    """A variable that lives in no shared memory (Function, Private, Input): its value."""

    type: Type
    value: Any


@dataclass
class Ptr:
    target: Memory | Local
    type: Type  # the pointee
    offset: Any = 0  # Memory: byte offset (int64, one or one per invocation)
    path: tuple[int, ...] = ()  # Local: component indices into the value


@dataclass(frozen=True)
class BarrierToken:
    ins: Ins
    memory_scope: int
    semantics: int


@dataclass(frozen=True)
class MatrixConfig:
    """One VkCooperativeMatrixPropertiesKHR entry. Component types are named as
    component_name() names them: float16, bfloat16, float32, float8_e4m3, float8_e5m2,
    sint8, uint8, sint32, uint32, ..."""

    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str
    scope: int = Scope.Subgroup
    saturating: bool = False


def component_name(t: Type, signed: bool | None = None) -> str:
    """The Vulkan component type of a SPIR-V scalar type; an integer's signedness comes
    from `signed` where given (the MulAdd's operands), else from the type."""
    t = scalar_of(t)
    if isinstance(t, IntT):
        s = t.signed if signed is None else signed
        return f"{'s' if s else 'u'}int{t.width}"
    if isinstance(t, FloatT):
        names: dict[int | None, str] = {
            None: f"float{t.width}", FPEncoding.BFloat16KHR: "bfloat16",
            FPEncoding.Float8E4M3EXT: "float8_e4m3", FPEncoding.Float8E5M2EXT: "float8_e5m2"}
        return names[t.encoding]
    raise Unsupported(f"component type {type(t).__name__}")


def _same_component(name: str, config_name: str) -> bool:
    """Integer signedness is not part of a SPIR-V cooperative matrix type (only of the
    MulAdd's operands), so a type matches a config entry of either signedness."""
    if name[1:4] == "int" and config_name[1:4] == "int":
        return name[1:] == config_name[1:]
    return name == config_name


@dataclass(frozen=True)
class MemoryOperands:
    aligned: int | None = None
    available: int | None = None  # scope of MakePointerAvailable
    visible: int | None = None  # scope of MakePointerVisible
    non_private: bool = False


def _garbage(dt: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """What uninitialised storage holds here: all bits set (NaN for every float type, -1
    or the maximum for integers), so that a result depending on it shows."""
    if dt == np.bool_:
        return np.ones(shape, bool)
    one = np.frombuffer(b"\xff" * dt.itemsize, dt)[0]
    return np.full(shape, one, dt)


def _inner_shape(t: Type) -> tuple[int, ...]:
    """The shape of one invocation's (or, holding matrices, one subgroup's) value."""
    if isinstance(t, (IntT, FloatT, BoolT)):
        return ()
    if isinstance(t, VectorT):
        return (t.count,)
    if isinstance(t, CoopMatT):
        return (t.rows, t.cols)
    if isinstance(t, ArrayT):
        return (t.length,) + _inner_shape(t.element)
    raise Unsupported(f"a value of {type(t).__name__} in a variable")


def _holds_matrices(t: Type) -> bool:
    """Values of such types are the subgroup's as a whole (one per subgroup)."""
    while isinstance(t, ArrayT):
        t = t.element
    return isinstance(t, CoopMatT)


def _leaf(t: Type) -> Type:
    while isinstance(t, ArrayT):
        t = t.element
    return t


def _same_path(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y or (np.ndim(x) == 0 and np.ndim(y) == 0 and x == y)
                                    for x, y in zip(a, b, strict=True))


# -- one wave ---------------------------------------------------------------------------------
class Wave:
    def __init__(self, group: Workgroup, positions: np.ndarray) -> None:
        interp = group.interp
        self.group, self.mod, self.sg = group, interp.mod, interp.sg
        self.n = positions.size
        self.S = self.n // self.sg
        self.values: dict[int, Any] = dict(interp.mod.constants)
        self.pred = np.zeros(self.n, np.int64)  # the block each invocation came from (OpPhi)
        self.subgroup = (positions - positions[0]) // self.sg  # subgroup within the wave
        self.lane = positions % self.sg  # SubgroupLocalInvocationId
        self.owner = group.first_owner + positions  # invocation ids for memory checks
        self.coop_owner = COOP_OWNER + (group.first_owner + positions[::self.sg]) // self.sg
        self.blocks_run = 0
        self.returns: list[Any] = []  # OpReturnValue results of the calls in progress
        self.calls: list[int] = []  # the functions being executed (no recursion)
        for var in self.mod.variables.values():
            self.values[var.id] = self._variable_pointer(var, positions)
        self.values.update(group.params)  # an OpenCL kernel's arguments

    def _variable_pointer(self, var: Any, positions: np.ndarray) -> Ptr:
        g = self.group
        if var.storage == StorageClass.Input:
            return Ptr(Local(var.pointee, g.builtin(var, positions)), var.pointee)
        if var.storage == StorageClass.Private:
            init = self.values[var.initializer] if var.initializer else self.garbage(var.pointee)
            return Ptr(Local(var.pointee, init), var.pointee)
        return Ptr(g.memory[var.id], var.pointee, np.int64(0))

    # -- values -----------------------------------------------------------------------
    def val(self, id_: int) -> Any:
        try:
            return self.values[id_]
        except KeyError:
            raise InterpreterError(f"%{id_} used where it has no value") from None

    def type_of(self, id_: int) -> Type:
        return self.mod.value_types[id_]

    def put(self, ins: Ins, value: Any, mask: Mask) -> None:
        """Set the result for the active invocations (others keep theirs: a loop may
        run an instruction again for fewer invocations)."""
        rid = ins.rid
        if mask.full or rid not in self.values:
            self.values[rid] = value
            return
        old, t = self.values[rid], ins.rtype
        if isinstance(t, PointerT):
            if old.target is not value.target or len(old.path) != len(value.path):
                raise Unsupported("a pointer that selects different objects per invocation")
            path = value.path if _same_path(old.path, value.path) else tuple(
                np.where(mask.lanes, new, prev) for new, prev in zip(value.path, old.path,
                                                                       strict=True))
            offset = np.where(mask.lanes, value.offset, old.offset) if isinstance(
                value.target, Memory) else 0
            self.values[rid] = Ptr(value.target, value.type, offset, path)
            return
        assert t is not None
        self.values[rid] = np.where(self.lane_mask(mask, t), value, old)

    def lane_mask(self, mask: Mask, t: Type) -> np.ndarray:
        """The mask shaped to broadcast against a per-invocation (per-subgroup, for
        matrices) value of type t."""
        inner = (1,) * len(_inner_shape(t))
        if _holds_matrices(t):
            return np.any(mask.lanes.reshape(self.S, self.sg), axis=1).reshape((self.S,) + inner)
        return mask.lanes.reshape((self.n,) + inner)

    def lanes(self, value: Any, t: Type) -> np.ndarray:
        """The value with one entry per invocation."""
        value = np.asarray(value)
        if value.ndim == lane_ndim(t):
            return np.broadcast_to(value, (self.n,) + value.shape)
        return value

    def per_subgroup(self, value: Any, mask: Mask, what: str) -> np.ndarray:
        """A value that must be dynamically uniform within each subgroup, one per subgroup
        (of the wave); raise where the active invocations of a subgroup disagree."""
        value = np.asarray(value)
        if value.ndim == 0:
            return np.broadcast_to(value, (self.S,))
        v = value.reshape(self.S, self.sg)
        act = mask.lanes.reshape(self.S, self.sg)
        first = v[np.arange(self.S), act.argmax(axis=1)]
        if (act & (v != first[:, None])).any():
            raise UndefinedBehavior(f"{what} is not dynamically uniform within a subgroup")
        return first

    def tangled(self, mask: Mask, ins: Ins) -> np.ndarray:
        """The active subgroups, for an instruction that needs each subgroup wholly
        active or wholly inactive."""
        if mask.full:
            return np.ones(self.S, bool)
        act = mask.lanes.reshape(self.S, self.sg)
        some: np.ndarray = np.any(act, axis=1)
        if np.any(some != np.all(act, axis=1)):
            raise UndefinedBehavior(f"{ins} runs with only part of a subgroup active")
        return some

    def garbage(self, t: Type) -> np.ndarray:
        """An uninitialised value of type t (one per invocation, or per subgroup)."""
        lead = (self.S,) if _holds_matrices(t) else (self.n,)
        return _garbage(np_dtype(_leaf(t)), lead + _inner_shape(t))

    # -- variables that are values (Function, Private, Input) ------------------------
    def local_get(self, p: Ptr, mask: Mask) -> Any:
        """The value p points to inside a Local: p.path indexes arrays, vectors and an
        invocation's elements of a matrix, each index a number or one per invocation."""
        assert isinstance(p.target, Local)
        v, t = p.target.value, p.target.type
        if not p.path:
            return v
        v = np.asarray(v)
        uniform = v.ndim == len(_inner_shape(t))
        rows = self.S if _holds_matrices(t) else self.n
        for index in p.path:
            if isinstance(t, CoopMatT):
                if uniform:
                    v = np.broadcast_to(v, (rows,) + v.shape)
                flat = _matrix_element_index(self, t, index, check=False)
                v = v.reshape(rows, -1)[self.subgroup, flat]
                uniform = False
                t = t.component
                continue
            if np.ndim(index) == 0:
                v = v[int(index)] if uniform else v[:, int(index)]
            else:
                at = self.per_subgroup(index, mask, "an index into matrices") if \
                    _holds_matrices(t) else index
                if uniform:
                    v = np.broadcast_to(v, (rows,) + v.shape)
                v = v[np.arange(rows), at]
                uniform = False
            t = t.element if isinstance(t, ArrayT) else t.component  # type: ignore[attr-defined]
        return v

    def local_set(self, p: Ptr, value: Any, mask: Mask, ins: Ins) -> None:
        local = p.target
        assert isinstance(local, Local)
        t = local.type
        if not p.path:
            if mask.full:
                local.value = value
                return
            if _holds_matrices(t):
                self.tangled(mask, ins)  # a matrix variable is its subgroup's as a whole
            local.value = np.where(self.lane_mask(mask, t), value, local.value)
            return
        matrices = _holds_matrices(t)
        rows = self.S if matrices else self.n
        whole = np.array(np.broadcast_to(local.value, (rows,) + _inner_shape(t)))
        depth = 0  # array levels above the matrices
        while isinstance(t, ArrayT):
            t, depth = t.element, depth + 1
        if matrices and len(p.path) == depth + 1:
            # One element per invocation: each active invocation writes its own element,
            # which needs no uniform control flow (the access is through a pointer).
            lanes = np.nonzero(mask.lanes)[0]
            subs = self.subgroup[lanes]
            where: list[Any] = [subs]
            for index in p.path[:-1]:
                where.append(np.broadcast_to(self.per_subgroup(
                    index, mask, "an index into matrices"), (self.S,))[subs])
            assert isinstance(t, CoopMatT)
            flat = _matrix_element_index(self, t, p.path[-1], check=False)[lanes]
            where += [flat // t.cols, flat % t.cols]
            whole[tuple(where)] = self.lanes(value, p.type)[lanes]
            local.value = whole
            return
        active = self.tangled(mask, ins) if matrices else mask.lanes
        r = np.nonzero(active)[0]
        where = [r]
        for index in p.path:
            if np.ndim(index) == 0:
                where.append(np.full(r.size, int(index)))
            else:
                at = self.per_subgroup(index, mask, "an index into matrices") if matrices \
                    else np.asarray(index)
                where.append(at[r])
        leaf = p.type
        whole[tuple(where)] = np.broadcast_to(value, (rows,) + _inner_shape(leaf))[r]
        local.value = whole

    # -- function calls ---------------------------------------------------------------
    def call(self, ins: Ins, fn: Any, mask: Mask) -> Generator[BarrierToken, None, None]:
        if fn.id in self.calls:
            raise UndefinedBehavior(f"{ins}: recursion")
        for param, arg in zip(fn.params, ins.args[1:], strict=True):
            self.values[param] = self.values[arg]
        self.calls.append(fn.id)
        self.returns.append(None)
        yield from self._run(fn.first_label, mask, frozenset())
        self.calls.pop()
        value = self.returns.pop()
        if ins.rid and not isinstance(ins.rtype, VoidT):
            if value is None:
                raise InterpreterError(f"{ins}: the function returned no value")
            self.put(ins, value, mask)

    def active(self, mask: Mask, cond: np.ndarray) -> bool:
        """Whether cond (per invocation or uniform) holds for some active invocation."""
        cond = np.asarray(cond)
        if cond.ndim == 0:
            return bool(cond) and mask.count > 0
        lanes = mask.lanes.reshape((self.n,) + (1,) * (cond.ndim - 1))
        return bool(np.any(cond & lanes))

    # -- structured control flow ------------------------------------------------------
    def main(self) -> Generator[BarrierToken, None, None]:
        yield from self._run(self.mod.first_label, Mask(np.ones(self.n, bool)), frozenset())

    def _run(self, label: int, mask: Mask, stops: frozenset[int],
             loop_header: bool = False) -> Generator[BarrierToken, None, dict[int, Mask]]:
        """Run the invocations in `mask` from block `label` until each has reached one of
        `stops` (or returned); the masks that reached each stop."""
        arrived: dict[int, Mask] = {}

        def reach(stop: int, m: Mask) -> None:
            arrived[stop] = arrived[stop] | m if stop in arrived else m

        while True:
            if label in stops and not loop_header:
                reach(label, mask)
                return arrived
            blk = self.mod.blocks[label]
            if blk.loop is not None and not loop_header:
                mask = yield from self._loop(blk, mask)
                label = blk.loop[0]
                if not mask.count:
                    return arrived
                continue
            loop_header = False
            yield from self._block(blk, mask)
            term = blk.term
            assert term is not None
            if term.op == Op.Return:
                return arrived
            if term.op == Op.ReturnValue:
                value = self.val(term.args[0])
                old = self.returns[-1]
                self.returns[-1] = value if old is None or mask.full else np.where(
                    self.lane_mask(mask, self.type_of(term.args[0])), value, old)
                return arrived
            self.pred[mask.lanes] = label
            if term.op == Op.Branch:
                label = term.args[0]
                continue
            # OpBranchConditional
            cond = np.broadcast_to(np.asarray(self.val(term.args[0]), bool), (self.n,))
            sides = [(term.args[1], Mask(mask.lanes & cond)),
                     (term.args[2], Mask(mask.lanes & ~cond))]
            if blk.selection is not None:
                merge = blk.selection
                joined = Mask(np.zeros(self.n, bool))
                for target, m in sides:
                    if m.count:
                        sub = yield from self._run(target, m, stops | {merge})
                        for stop, sm in sub.items():
                            if stop == merge:
                                joined = joined | sm
                            else:
                                reach(stop, sm)
                mask, label = joined, merge
                if not mask.count:
                    return arrived
                continue
            # Without a merge instruction, a conditional branch may only leave a construct
            # (a loop's break or continue): at most one side carries on here.
            onward = []
            for target, m in sides:
                if not m.count:
                    continue
                if target in stops:
                    reach(target, m)
                else:
                    onward.append((target, m))
            if len(onward) == 2 and onward[0][0] == onward[1][0]:
                onward = [(onward[0][0], onward[0][1] | onward[1][1])]
            if len(onward) > 1:
                raise InterpreterError(f"{term} in block %{label} splits the invocations "
                                       "without a merge instruction")
            if not onward:
                return arrived
            label, mask = onward[0]

    def _loop(self, header: Block, mask: Mask) -> Generator[BarrierToken, None, Mask]:
        """Run a loop until no invocation is left in it; the mask that reaches its merge."""
        assert header.loop is not None
        merge, cont = header.loop
        if cont == header.label:
            raise Unsupported("a loop whose continue target is its header")
        exits = Mask(np.zeros(self.n, bool))
        active = mask
        while active.count:
            body = yield from self._run(header.label, active, frozenset({merge, cont}),
                                        loop_header=True)
            if merge in body:
                exits = exits | body[merge]
            if cont not in body:
                break
            back = yield from self._run(cont, body[cont], frozenset({header.label, merge}))
            if merge in back:
                exits = exits | back[merge]
            if header.label not in back:
                break
            active = back[header.label]
        return exits

    def _block(self, blk: Block, mask: Mask) -> Generator[BarrierToken, None, None]:
        self.blocks_run += 1
        if self.blocks_run > MAX_BLOCKS:
            raise InterpreterError("endless loop?")
        if blk.phis:
            # Every OpPhi of a block reads the values on entry, then all are set.
            results = [(ins, self._phi(ins, mask)) for ins in blk.phis]
            for ins, value in results:
                self.put(ins, value, mask)
        for ins in blk.body:
            token = ins.fn(self, mask)  # type: ignore[misc]
            if token is not None:  # a barrier, or a call (a generator) to run
                if isinstance(token, BarrierToken):
                    yield token
                else:
                    yield from token
        self.group.interp.executed += len(blk.body) + len(blk.phis) + 1

    def _phi(self, ins: Ins, mask: Mask) -> Any:
        assert ins.rtype is not None
        if isinstance(ins.rtype, (CoopMatT, PointerT)):
            raise Unsupported(f"{ins} of a cooperative matrix or pointer")
        out: Any = None
        pairs = list(zip(ins.args[0::2], ins.args[1::2], strict=True))
        for value_id, parent in pairs:
            came = mask.lanes & (self.pred == parent)
            if not came.any():
                continue
            v = self.lanes(self.val(value_id), ins.rtype)
            out = v if out is None else np.where(
                came.reshape((self.n,) + (1,) * lane_ndim(ins.rtype)), v, out)
        if out is None:
            raise InterpreterError(f"{ins}: no invocation came from a listed parent")
        return out


# -- one workgroup ----------------------------------------------------------------------------
class Workgroup:
    def __init__(self, interp: Interpreter, wg: tuple[int, int, int],
                 groups: tuple[int, int, int], buffers: Mapping[int, Memory],
                 params: Mapping[int, Any] | None = None) -> None:
        self.interp, self.wg, self.groups = interp, wg, groups
        self.params = dict(params or {})  # entry point parameter id -> its value
        mod = interp.mod
        linear = wg[0] + groups[0] * (wg[1] + groups[1] * wg[2])
        self.first_owner: int = linear * interp.invocations
        self.memory: dict[int, Memory] = dict(buffers)
        self.shared: list[Memory] = []
        for var in mod.variables.values():
            if var.storage == StorageClass.Workgroup:
                if var.initializer is not None:
                    raise Unsupported("an initialised Workgroup variable")
                mem = Memory(mod.names.get(var.id, f"%{var.id}"), var.storage,
                             type_size(var.pointee), writable=True)
                self.memory[var.id] = mem
                self.shared.append(mem)

    def builtin(self, var: Any, positions: np.ndarray) -> np.ndarray:
        interp = self.interp
        which = self.interp.mod.decoration(var.id, Decoration.BuiltIn)
        if which is None:
            raise Unsupported(f"an Input variable %{var.id} that is no built-in")
        sx, sy, sz = interp.mod.local_size
        index = interp.local_index[positions].astype(np.uint32)
        local = np.stack([index % sx, index // sx % sy, index // (sx * sy)], axis=1)
        def u32(x: Any) -> np.ndarray:
            return np.asarray(x).astype(np.uint32)

        values = {
            BuiltIn.WorkgroupId: u32(self.wg),
            BuiltIn.NumWorkgroups: u32(self.groups),
            BuiltIn.WorkgroupSize: u32(interp.mod.local_size),
            BuiltIn.LocalInvocationIndex: index,
            BuiltIn.LocalInvocationId: u32(local),
            BuiltIn.GlobalInvocationId: u32(u32(self.wg) * u32(interp.mod.local_size) + local),
            BuiltIn.SubgroupSize: u32(interp.sg),
            BuiltIn.NumSubgroups: u32(interp.invocations // interp.sg),
            BuiltIn.SubgroupId: u32(positions // interp.sg),
            BuiltIn.SubgroupLocalInvocationId: u32(positions % interp.sg),
        }
        try:
            value = values[BuiltIn(which[0])]
        except (KeyError, ValueError):
            raise Unsupported(f"built-in {which[0]}") from None
        # As declared: Vulkan's are 32-bit, OpenCL's ids are size_t (64-bit under
        # Physical64).
        return value.astype(np_dtype(var.pointee), copy=False)

    def execute(self) -> None:
        interp = self.interp
        n = interp.invocations
        if interp.lockstep == "workgroup":
            waves = [Wave(self, np.arange(n))]
        else:
            waves = [Wave(self, np.arange(s, s + interp.sg)) for s in range(0, n, interp.sg)]
        runs = [w.main() for w in waves]
        while True:
            tokens = [next(r, None) for r in runs]
            if all(t is None for t in tokens):
                return
            where = {t.ins.index if t is not None else None for t in tokens}
            if len(where) != 1:
                raise UndefinedBehavior("the subgroups of a workgroup do not all reach the "
                                        f"same barrier ({sorted(map(str, where))})")
            token = tokens[0]
            assert token is not None
            self._barrier(token)

    def _barrier(self, token: BarrierToken) -> None:
        """A control barrier: it orders the workgroup's accesses to shared memory where
        its semantics name WorkgroupMemory, and to storage buffers where they name
        UniformMemory. Across workgroups, which run one after another here, a storage
        buffer's accesses are in dispatch order; the barriers' epochs let a later
        workgroup read what an earlier one made available (the split-K's partials,
        ordered on a GPU by its counters' atomics)."""
        sem = token.semantics
        ordering = bool(sem & (MemorySemantics.AcquireRelease
                               | MemorySemantics.SequentiallyConsistent)) and \
            token.memory_scope in WORKGROUP_OR_WIDER
        available = bool(sem & MemorySemantics.MakeAvailable)
        visible = bool(sem & MemorySemantics.MakeVisible)
        for mem in self.shared:
            mem.barrier(ordering and bool(sem & MemorySemantics.WorkgroupMemory), available,
                        visible, token.memory_scope)
        if sem & MemorySemantics.UniformMemory:
            storage = {id(m): m for m in self.memory.values()
                       if m.storage == StorageClass.StorageBuffer}
            for mem in storage.values():
                mem.barrier(ordering, available, visible, token.memory_scope)


# -- the interpreter --------------------------------------------------------------------------
class Interpreter:
    """Executes a GLCompute module as a Vulkan device with the given subgroup size would.

    matrix_configs: the device's VkCooperativeMatrixPropertiesKHR list; when given, every
    cooperative matrix type and multiply-add must match an entry, as the Vulkan runtime
    rules ask (VUID-RuntimeSpirv-OpTypeCooperativeMatrixKHR-10163, -MulAddKHR-10060).
    mma_configs: likewise for OpSubgroupMatrixMultiplyAccumulateINTEL (intel_mma.MmaConfig).
    A Kernel module (OpenCL) runs with dispatch_kernel, its arguments given in order.
    scramble: number the invocations (LocalInvocationIndex) in an order unrelated to
    their subgroups, which Vulkan allows ("no direct relationship"), so that a kernel
    assuming one is caught. spec_constants: SpecId -> value.
    """

    def __init__(self, spirv: bytes, *, subgroup_size: int,
                 spec_constants: Mapping[int, Any] | None = None,
                 matrix_configs: Sequence[MatrixConfig] | None = None,
                 mma_configs: Sequence[Any] | None = None,
                 lockstep: str = "workgroup", scramble: bool = True) -> None:
        if lockstep not in ("workgroup", "subgroup"):
            raise ValueError(lockstep)
        self.mod = Module(spirv, spec_constants, spec_op=_spec_constant_op)
        self.sg, self.lockstep = subgroup_size, lockstep
        required = self.mod.required_subgroup_size()
        if required is not None and required != subgroup_size:
            raise InterpreterError(f"the entry point requires sub-group size {required}, "
                                   f"not {subgroup_size}")
        self.configs = list(matrix_configs) if matrix_configs is not None else None
        # SPV_INTEL_subgroup_matrix_multiply_accumulate: the device's supported
        # (M, N, K, types), intel_mma.MmaConfig; None: any the instruction can express.
        self.mma_configs = list(mma_configs) if mma_configs is not None else None
        sx, sy, sz = self.mod.local_size
        self.invocations: int = sx * sy * sz
        if sx % subgroup_size:
            # Vulkan guarantees full subgroups only when X is a multiple of the size.
            raise Unsupported(f"local size X {sx} is not a multiple of the subgroup size "
                              f"{subgroup_size}")
        order = np.arange(self.invocations)
        if scramble:
            order = np.random.default_rng(20240917).permutation(self.invocations)
        self.local_index = order  # LocalInvocationIndex of the invocation at each position
        self.executed = 0
        for blk in self.mod.blocks.values():
            for ins in blk.body:
                factory = HANDLERS.get(ins.op)
                if factory is None:
                    raise Unsupported(f"instruction {ins}")
                ins.fn = factory(ins, self.mod)
            if blk.term is None or blk.term.op not in (Op.Return, Op.ReturnValue, Op.Branch,
                                                       Op.BranchConditional):
                raise Unsupported(f"terminator {blk.term}")
        for t in self.mod.types.values():
            if isinstance(t, CoopMatT):
                self._check_matrix_type(t)

    def _check_matrix_type(self, t: CoopMatT) -> None:
        if t.scope != Scope.Subgroup:
            raise Unsupported(f"cooperative matrices of scope {t.scope}")
        if (t.rows * t.cols) % self.sg:
            raise Unsupported("a matrix whose elements do not split evenly over the subgroup")
        if self.configs is None:
            return
        name = component_name(t.component)
        for c in self.configs:
            shape, ctype = {
                CooperativeMatrixUse.MatrixA: ((c.m, c.k), [c.a]),
                CooperativeMatrixUse.MatrixB: ((c.k, c.n), [c.b]),
                CooperativeMatrixUse.MatrixAccumulator: ((c.m, c.n), [c.c, c.result]),
            }[CooperativeMatrixUse(t.use)]
            if c.scope == t.scope and shape == (t.rows, t.cols) and any(
                    _same_component(name, x) for x in ctype):
                return
        raise UndefinedBehavior(f"cooperative matrix type {name} {t.rows}x{t.cols} use "
                                f"{t.use} matches no entry of the device's list")

    def dispatch(self, groups: tuple[int, int, int], buffers: Mapping[int, np.ndarray],
                 push_constants: bytes = b"") -> dict[int, dict[str, int]]:
        """Run every workgroup of vkCmdDispatch(*groups). `buffers` maps the binding of
        each storage buffer (descriptor set 0) to a contiguous numpy array, its whole
        content; what the module writes lands back in those arrays. Returns, per binding
        written, the elements stored by OpStore ("scalar") and by cooperative-matrix
        stores ("matrix")."""
        mod = self.mod
        memories: dict[int, Memory] = {}
        arrays: dict[int, tuple[np.ndarray, Memory]] = {}
        by_binding: dict[int, Memory] = {}
        for var in mod.variables.values():
            if var.storage == StorageClass.StorageBuffer:
                binding = mod.decoration(var.id, Decoration.Binding)
                dset = mod.decoration(var.id, Decoration.DescriptorSet)
                if binding is None or dset is None or dset[0] != 0:
                    raise Unsupported("a storage buffer outside descriptor set 0")
                if binding[0] not in buffers:
                    raise InterpreterError(f"no buffer for binding {binding[0]}")
                arr = buffers[binding[0]]
                if not arr.flags.c_contiguous:
                    raise ValueError("buffers must be contiguous arrays")
                raw = arr.reshape(-1).view(np.uint8)
                block = var.pointee
                if not isinstance(block, StructT) or mod.decoration(
                        block.id, Decoration.Block) is None:
                    raise InterpreterError("a storage buffer that is not a Block struct")
                def everywhere(dec: int, block: StructT = block) -> bool:
                    return all(dec in mod.member_decorations.get((block.id, i), {})
                               for i in range(len(block.members)))

                readonly = everywhere(Decoration.NonWritable)
                if binding[0] in by_binding:  # variables aliasing one buffer share it
                    mem = by_binding[binding[0]]
                    if not readonly and not mem.writable:
                        raise Unsupported(f"binding {binding[0]}: a writable variable "
                                          "aliasing a read-only one")
                    memories[var.id] = mem
                    continue
                mem = Memory(f"binding {binding[0]}", var.storage, raw.size,
                             writable=not readonly, init=raw,
                             readable=not everywhere(Decoration.NonReadable))
                memories[var.id] = by_binding[binding[0]] = mem
                if mem.writable:
                    arrays[binding[0]] = (raw, mem)
            elif var.storage == StorageClass.PushConstant:
                memories[var.id] = Memory("push constants", var.storage, len(push_constants),
                                          writable=False,
                                          init=np.frombuffer(push_constants, np.uint8))
        self._run_groups(groups, memories)
        for raw, mem in arrays.values():
            raw[:] = mem.data[:raw.size]
        return {binding: dict(mem.stored) for binding, (_, mem) in arrays.items()}

    def _run_groups(self, groups: tuple[int, int, int], memories: Mapping[int, Memory],
                    params: Mapping[int, Any] | None = None) -> None:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for z in range(groups[2]):
                for y in range(groups[1]):
                    for x in range(groups[0]):
                        Workgroup(self, (x, y, z), groups, memories, params).execute()

    def dispatch_kernel(self, groups: tuple[int, int, int],
                        args: Sequence[Any]) -> dict[str, dict[str, int]]:
        """Run an OpenCL kernel (a Kernel entry point) on `groups` workgroups, as
        clEnqueueNDRangeKernel with a global size of groups x the module's LocalSize
        would. `args` are its arguments in order: a contiguous numpy array for each
        global pointer (the buffer's whole content; what the kernel writes lands back in
        it), a number for each scalar. Returns, per pointer argument (by its OpName),
        the elements stored ("scalar")."""
        mod = self.mod
        if mod.execution_model != ExecutionModel.Kernel:
            raise InterpreterError("dispatch_kernel runs Kernel entry points; use dispatch")
        assert mod.entry is not None
        fn = mod.functions[mod.entry[0]]
        if len(args) != len(fn.params):
            raise InterpreterError(f"the kernel takes {len(fn.params)} arguments, "
                                   f"not {len(args)}")
        params: dict[int, Any] = {}
        arrays: list[tuple[str, np.ndarray, Memory]] = []
        for i, (pid, value) in enumerate(zip(fn.params, args, strict=True)):
            t = mod.value_types[pid]
            name = mod.names.get(pid, f"argument {i}")
            if isinstance(t, PointerT):
                if t.storage != StorageClass.CrossWorkgroup:
                    raise Unsupported(f"kernel argument {name!r} in storage class "
                                      f"{t.storage}")
                if not isinstance(value, np.ndarray) or not value.flags.c_contiguous:
                    raise InterpreterError(f"kernel argument {name!r} is a global pointer: "
                                           "pass a contiguous numpy array")
                raw = value.reshape(-1).view(np.uint8)
                mem = Memory(name, StorageClass.CrossWorkgroup, raw.size, writable=True,
                             init=raw)
                params[pid] = Ptr(mem, t.pointee, np.int64(0))
                arrays.append((name, raw, mem))
            elif isinstance(t, (IntT, FloatT)):
                if isinstance(value, np.ndarray):
                    raise InterpreterError(f"kernel argument {name!r} is a scalar")
                if isinstance(t, IntT):  # (two's complement where given a negative one)
                    bits = int(value) & ((1 << t.width) - 1)
                    params[pid] = np.array(bits, int_dtype(t.width, False)).astype(np_dtype(t))
                else:
                    params[pid] = np.array(value, np_dtype(t))
            else:
                raise Unsupported(f"kernel argument {name!r} of {type(t).__name__}")
        self._run_groups(groups, {}, params)
        for _, raw, mem in arrays:
            raw[:] = mem.data[:raw.size]
        return {name: dict(mem.stored) for name, _, mem in arrays if mem.stored["scalar"]}


# -- instruction handlers -----------------------------------------------------------------------
# A factory per opcode takes the decoded instruction (and the module) once, when the module
# is loaded, checks what can be checked statically and returns the function that executes
# it for a wave under a mask.
Run = Callable[[Wave, Mask], "BarrierToken | None"]
Factory = Callable[[Ins, Module], Run]
HANDLERS: dict[int, Factory] = {}


def handles(*ops: Op) -> Callable[[Factory], Factory]:
    def register(fn: Factory) -> Factory:
        for op in ops:
            HANDLERS[op] = fn
        return fn
    return register


def _plain(*ops: Op) -> Callable[[Callable[[Wave, Ins, Mask], Any]], Any]:
    """Register a handler that does all its work when executed (the rarely run ones)."""
    def register(h: Callable[[Wave, Ins, Mask], Any]) -> Any:
        def factory(ins: Ins, mod: Module) -> Run:
            return lambda w, mask: h(w, ins, mask)
        for op in ops:
            HANDLERS[op] = factory
        return h
    return register


def _rtype(ins: Ins) -> Type:
    assert ins.rtype is not None
    return ins.rtype


def _int_type(t: Type, ins: Ins) -> IntT:
    s = scalar_of(t)
    if not isinstance(s, IntT):
        raise UndefinedBehavior(f"{ins} needs integer operands")
    return s


def _float_type(t: Type, ins: Ins) -> FloatT:
    s = scalar_of(t)
    if not isinstance(s, FloatT):
        raise UndefinedBehavior(f"{ins} needs floating-point operands")
    if is_fp8(s):  # SPV_EXT_float8: no arithmetic on float8 values
        raise UndefinedBehavior(f"{ins}: arithmetic on a float8 type")
    return s


def _operands_match(ins: Ins, mod: Module, ids: Sequence[int], like: Type,
                    same_signedness: bool = False) -> None:
    """The operands must have the result's shape (scalar, n-vector or matrix) and the
    width of its component type, as the instruction's rules say."""
    want = scalar_of(like)
    for i in ids:
        t = mod.value_types.get(i)
        if t is None:
            raise InterpreterError(f"{ins}: %{i} is not a value")
        s = scalar_of(t)
        if type(s) is not type(want) or getattr(s, "width", 0) != getattr(want, "width", 0) \
                or _inner_shape(t) != _inner_shape(like):
            raise UndefinedBehavior(f"{ins}: operand %{i} does not match the result type")
        if isinstance(s, FloatT) and isinstance(want, FloatT) and s.encoding != want.encoding:
            raise UndefinedBehavior(f"{ins}: operand %{i} has another float encoding")


def _setter(ins: Ins) -> Callable[[Wave, Any, Mask], None]:
    """Store a result: straight into the values where every invocation is active, through
    Wave.put otherwise; cooperative-matrix results first check that whole subgroups run."""
    rid = ins.rid
    coop = isinstance(ins.rtype, CoopMatT)

    def put(w: Wave, value: Any, mask: Mask) -> None:
        if mask.full:
            w.values[rid] = value
            return
        if coop:
            w.tangled(mask, ins)
        w.put(ins, value, mask)
    return put


def _int_binary(fn: Callable[[Any, Any], Any], signed: bool | None = None) -> Factory:
    """An integer operation computed in the result's width (two's complement wrap-around);
    `signed` reads the operands as signed/unsigned where the opcode says so."""
    def factory(ins: Ins, mod: Module) -> Run:
        t = _int_type(_rtype(ins), ins)
        _operands_match(ins, mod, ins.args[:2], _rtype(ins))
        dt = np_dtype(t)
        x, y = ins.args[0], ins.args[1]
        put = _setter(ins)

        def run(w: Wave, mask: Mask) -> None:
            v = w.values
            put(w, fn(v[x].astype(dt, copy=False), v[y].astype(dt, copy=False)), mask)
        return run
    return factory


HANDLERS[Op.IAdd] = _int_binary(np.add)
HANDLERS[Op.ISub] = _int_binary(np.subtract)
HANDLERS[Op.IMul] = _int_binary(np.multiply)
HANDLERS[Op.BitwiseAnd] = _int_binary(np.bitwise_and)
HANDLERS[Op.BitwiseOr] = _int_binary(np.bitwise_or)
HANDLERS[Op.BitwiseXor] = _int_binary(np.bitwise_xor)


@handles(Op.UDiv, Op.UMod)
def _udiv(ins: Ins, mod: Module) -> Run:
    t = _int_type(_rtype(ins), ins)
    if isinstance(ins.rtype, CoopMatT):
        raise Unsupported(f"{ins} on cooperative matrices")
    _operands_match(ins, mod, ins.args[:2], _rtype(ins))
    dt, udt = np_dtype(t), int_dtype(t.width, False)
    x, y = ins.args[0], ins.args[1]
    fn = np.floor_divide if ins.op == Op.UDiv else np.remainder
    # Division by a constant: checked once, here.
    const_ok = y in mod.constants and np.all(mod.constants[y] != 0)
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        a = w.values[x].astype(udt, copy=False)
        b = w.values[y].astype(udt, copy=False)
        if not const_ok:
            zero = b == 0
            if w.active(mask, zero):
                raise UndefinedBehavior(f"{ins}: division by zero")
            b = np.where(zero, udt.type(1), b)
        put(w, fn(a, b).astype(dt, copy=False), mask)
    return run


def _shift(kind: str) -> Factory:
    def factory(ins: Ins, mod: Module) -> Run:
        t = _int_type(_rtype(ins), ins)
        st = _int_type(mod.value_types[ins.args[1]], ins)
        x, y = ins.args[0], ins.args[1]
        udt, sdt, dt = int_dtype(t.width, False), int_dtype(t.width, True), np_dtype(t)
        put = _setter(ins)

        def run(w: Wave, mask: Mask) -> None:
            amount = w.values[y].astype(int_dtype(st.width, False)).astype(np.int64)
            if w.active(mask, amount >= t.width):
                raise UndefinedBehavior(f"{ins}: shift by the width or more")
            amount = np.minimum(amount, t.width - 1)
            base = w.values[x]
            if kind == "right_arith":
                r = base.astype(sdt).astype(np.int64) >> amount
            else:
                u = base.astype(udt).astype(np.uint64)
                a = amount.astype(np.uint64)
                r = (u >> a) if kind == "right" else (u << a)
            put(w, r.astype(udt).astype(dt, copy=False), mask)
        return run
    return factory


HANDLERS[Op.ShiftRightLogical] = _shift("right")
HANDLERS[Op.ShiftRightArithmetic] = _shift("right_arith")
HANDLERS[Op.ShiftLeftLogical] = _shift("left")


@handles(Op.SNegate, Op.Not)
def _int_unary(ins: Ins, mod: Module) -> Run:
    dt = np_dtype(_int_type(_rtype(ins), ins))
    fn = np.negative if ins.op == Op.SNegate else np.invert
    x = ins.args[0]
    put = _setter(ins)
    return lambda w, mask: put(w, fn(w.values[x].astype(dt, copy=False)), mask)


def _compare(fn: Callable[[Any, Any], Any], signed: bool) -> Factory:
    def factory(ins: Ins, mod: Module) -> Run:
        t = _int_type(mod.value_types[ins.args[0]], ins)
        _operands_match(ins, mod, ins.args[1:2], mod.value_types[ins.args[0]])
        dt = int_dtype(t.width, signed)
        x, y = ins.args[0], ins.args[1]
        put = _setter(ins)

        def run(w: Wave, mask: Mask) -> None:
            v = w.values
            put(w, fn(v[x].astype(dt, copy=False), v[y].astype(dt, copy=False)), mask)
        return run
    return factory


HANDLERS[Op.IEqual] = _compare(np.equal, False)
HANDLERS[Op.INotEqual] = _compare(np.not_equal, False)
HANDLERS[Op.ULessThan] = _compare(np.less, False)
HANDLERS[Op.ULessThanEqual] = _compare(np.less_equal, False)
HANDLERS[Op.UGreaterThan] = _compare(np.greater, False)
HANDLERS[Op.UGreaterThanEqual] = _compare(np.greater_equal, False)
HANDLERS[Op.SLessThan] = _compare(np.less, True)
HANDLERS[Op.SLessThanEqual] = _compare(np.less_equal, True)
HANDLERS[Op.SGreaterThan] = _compare(np.greater, True)
HANDLERS[Op.SGreaterThanEqual] = _compare(np.greater_equal, True)


def _fcompare(fn: Callable[[Any, Any], Any], ordered: bool) -> Factory:
    """A float comparison: ordered ones are false and unordered ones true where either
    operand is a NaN."""
    def factory(ins: Ins, mod: Module) -> Run:
        t = mod.value_types[ins.args[0]]
        dt = np_dtype(_float_type(t, ins))
        _operands_match(ins, mod, ins.args[1:2], t)
        x, y = ins.args[0], ins.args[1]
        put = _setter(ins)

        def run(w: Wave, mask: Mask) -> None:
            a = np.asarray(w.values[x]).astype(dt, copy=False)
            b = np.asarray(w.values[y]).astype(dt, copy=False)
            nan = np.isnan(a) | np.isnan(b)
            with np.errstate(invalid="ignore"):
                r = fn(a, b)
            put(w, (r & ~nan) if ordered else (r | nan), mask)
        return run
    return factory


for _name, _fn in (("Equal", np.equal), ("NotEqual", np.not_equal),
                   ("LessThan", np.less), ("GreaterThan", np.greater),
                   ("LessThanEqual", np.less_equal),
                   ("GreaterThanEqual", np.greater_equal)):
    HANDLERS[Op[f"FOrd{_name}"]] = _fcompare(_fn, True)
    HANDLERS[Op[f"FUnord{_name}"]] = _fcompare(_fn, False)


def _logical(fn: Callable[..., Any]) -> Factory:
    def factory(ins: Ins, mod: Module) -> Run:
        for a in ins.args:
            if not isinstance(scalar_of(mod.value_types[a]), BoolT):
                raise UndefinedBehavior(f"{ins} needs Boolean operands")
        args = list(ins.args)
        put = _setter(ins)
        return lambda w, mask: put(w, fn(*(w.values[a] for a in args)), mask)
    return factory


HANDLERS[Op.LogicalAnd] = _logical(np.logical_and)
HANDLERS[Op.LogicalOr] = _logical(np.logical_or)
HANDLERS[Op.LogicalNot] = _logical(np.logical_not)
HANDLERS[Op.LogicalEqual] = _logical(np.equal)
HANDLERS[Op.LogicalNotEqual] = _logical(np.not_equal)


@handles(Op.Select)
def _select(ins: Ins, mod: Module) -> Run:
    t = _rtype(ins)
    if isinstance(t, (CoopMatT, PointerT, StructT, ArrayT)):
        raise Unsupported(f"{ins} of {type(t).__name__}")
    c, x, y = ins.args
    # A scalar condition picks whole vectors.
    widen = isinstance(t, VectorT) and not isinstance(mod.value_types[c], VectorT)
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        cond = np.asarray(w.values[c])
        put(w, np.where(cond[..., None] if widen else cond, w.values[x], w.values[y]), mask)
    return run


def _float_binary(fn: Callable[[Any, Any], Any]) -> Factory:
    """Floating-point arithmetic, each result rounded to its type (numpy's float16 and
    ml_dtypes' bfloat16 compute in float32 and round to nearest even)."""
    def factory(ins: Ins, mod: Module) -> Run:
        dt = np_dtype(_float_type(_rtype(ins), ins))
        _operands_match(ins, mod, ins.args[:2], _rtype(ins))
        x, y = ins.args[0], ins.args[1]
        put = _setter(ins)

        def run(w: Wave, mask: Mask) -> None:
            v = w.values
            r = fn(v[x].astype(dt, copy=False), v[y].astype(dt, copy=False))
            put(w, r.astype(dt, copy=False), mask)
        return run
    return factory


HANDLERS[Op.FAdd] = _float_binary(np.add)
HANDLERS[Op.FSub] = _float_binary(np.subtract)
HANDLERS[Op.FMul] = _float_binary(np.multiply)
HANDLERS[Op.FDiv] = _float_binary(np.divide)


@handles(Op.FNegate)
def _fnegate(ins: Ins, mod: Module) -> Run:
    dt = np_dtype(_float_type(_rtype(ins), ins))
    x = ins.args[0]
    put = _setter(ins)
    return lambda w, mask: put(w, np.negative(w.values[x].astype(dt, copy=False)), mask)


@_plain(Op.MatrixTimesScalar)
def _matrix_times_scalar(w: Wave, ins: Ins, mask: Mask) -> None:
    t = _rtype(ins)
    if not isinstance(t, CoopMatT):
        raise Unsupported(f"{ins} on {type(t).__name__} (only cooperative matrices)")
    dt = np_dtype(_float_type(t, ins))
    if w.type_of(ins.args[1]) is not t.component:
        raise UndefinedBehavior(f"{ins}: the scalar's type is not the matrix's component type")
    w.tangled(mask, ins)
    mat = np.asarray(w.val(ins.args[0]))
    scalar = w.per_subgroup(w.val(ins.args[1]), mask, f"{ins}'s scalar")
    out = np.broadcast_to(mat, (w.S, t.rows, t.cols)) * scalar[:, None, None]
    w.put(ins, out.astype(dt, copy=False), mask)


@handles(Op.VectorTimesScalar)
def _vector_times_scalar(ins: Ins, mod: Module) -> Run:
    t = _rtype(ins)
    if not isinstance(t, VectorT):
        raise UndefinedBehavior(f"{ins}: the result must be a vector")
    dt = np_dtype(_float_type(t, ins))
    _operands_match(ins, mod, ins.args[:1], t)
    if mod.value_types[ins.args[1]] is not t.component:
        raise UndefinedBehavior(f"{ins}: the scalar's type is not the vector's component type")
    x, y = ins.args
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        vec = w.lanes(w.values[x], t).astype(dt, copy=False)
        scalar = np.asarray(w.values[y]).astype(dt, copy=False)
        put(w, (vec * (scalar[..., None] if scalar.ndim else scalar)).astype(dt), mask)
    return run


@handles(Op.Dot)
def _dot(ins: Ins, mod: Module) -> Run:
    """The float dot product of two vectors: the products summed in component order, each
    step rounded to the type (Vulkan gives OpDot the precision of OpFMul and OpFAdd)."""
    dt = np_dtype(_float_type(_rtype(ins), ins))
    x, y = ins.args
    vt = mod.value_types[x]
    if not isinstance(vt, VectorT) or vt.component is not _rtype(ins):
        raise UndefinedBehavior(f"{ins}: the operands must be vectors of the result's type")
    _operands_match(ins, mod, [y], vt)
    put = _setter(ins)

    def run(w: Wave, mask: Mask) -> None:
        a = w.lanes(w.values[x], vt).astype(dt, copy=False)
        b = w.lanes(w.values[y], vt).astype(dt, copy=False)
        products = (a * b).astype(dt)
        total = products[:, 0]
        for i in range(1, vt.count):
            total = (total + products[:, i]).astype(dt)
        put(w, total, mask)
    return run


# -- conversions ----------------------------------------------------------------------------
def _via_float32(t: Type) -> bool:
    s = scalar_of(t)
    return isinstance(s, FloatT) and s.encoding is not None


@handles(Op.UConvert, Op.SConvert, Op.FConvert, Op.ConvertUToF, Op.ConvertSToF,
         Op.ConvertFToU, Op.ConvertFToS)
def _convert(ins: Ins, mod: Module) -> Run:
    rt, st = _rtype(ins), mod.value_types[ins.args[0]]
    if isinstance(rt, CoopMatT) != isinstance(st, CoopMatT):
        raise UndefinedBehavior(f"{ins}: a matrix converts only to a matrix")
    if isinstance(rt, CoopMatT) and isinstance(st, CoopMatT) and (
            (rt.rows, rt.cols, rt.use, rt.scope) != (st.rows, st.cols, st.use, st.scope)):
        raise UndefinedBehavior(f"{ins}: the matrices differ in shape, use or scope")
    src, dst = scalar_of(st), scalar_of(rt)
    op, x = ins.op, ins.args[0]
    put = _setter(ins)
    steps: list[np.dtype]  # the conversion as a chain of numpy casts
    if op in (Op.UConvert, Op.SConvert):
        s, d = _int_type(src, ins), _int_type(dst, ins)
        signed = op == Op.SConvert  # zero- or sign-extension (or truncation)
        steps = [int_dtype(s.width, signed), int_dtype(d.width, signed), np_dtype(d)]
    elif op == Op.FConvert:
        if not isinstance(src, FloatT) or not isinstance(dst, FloatT):
            raise UndefinedBehavior(f"{ins} needs floating-point types")
        # SPV_KHR_bfloat16 (and float8 likewise): through binary32; rounding to nearest
        # even, as numpy and ml_dtypes round.
        via = [np.dtype(np.float32)] if _via_float32(src) or _via_float32(dst) else []
        steps = via + [np_dtype(dst)]
    elif op in (Op.ConvertUToF, Op.ConvertSToF):
        s = _int_type(src, ins)
        _float_type(dst, ins)
        via = [np.dtype(np.float32)] if _via_float32(dst) else []
        steps = [int_dtype(s.width, op == Op.ConvertSToF), np.dtype(np.float64), *via,
                 np_dtype(dst)]
    else:
        d = _int_type(dst, ins)
        _float_type(src, ins)
        info = np.iinfo(int_dtype(d.width, op == Op.ConvertFToS))

        def to_int(w: Wave, mask: Mask) -> None:
            v = np.trunc(w.values[x].astype(np.float64))
            if w.active(mask, ~((v >= info.min) & (v <= info.max))):
                raise UndefinedBehavior(f"{ins}: a value outside the integer type")
            out = np.where(np.isfinite(v), v, 0).astype(info.dtype).astype(np_dtype(d))
            put(w, out, mask)
        return to_int

    def run(w: Wave, mask: Mask) -> None:
        v = w.values[x]
        for dt in steps:
            v = v.astype(dt)
        put(w, v, mask)
    return run


@_plain(Op.Bitcast)
def _bitcast(w: Wave, ins: Ins, mask: Mask) -> None:
    rt, st = _rtype(ins), w.type_of(ins.args[0])
    if isinstance(rt, (CoopMatT, PointerT)) or isinstance(st, (CoopMatT, PointerT)):
        raise Unsupported(f"{ins} of matrices or pointers")
    if type_size(rt) != type_size(st):
        raise UndefinedBehavior(f"{ins}: the sizes differ")
    x = np.ascontiguousarray(w.val(ins.args[0]))
    per_lane = x.ndim > lane_ndim(st)
    out = x.view(np_dtype(rt))
    shape = ((w.n,) if per_lane else ()) + ((rt.count,) if isinstance(rt, VectorT) else ())
    w.put(ins, out.reshape(shape), mask)


# -- composites -------------------------------------------------------------------------------
def _matrix_element_index(w: Wave, t: CoopMatT, e: Any, check: bool = True) -> np.ndarray:
    """Flat (row-major) index of element e (a number, or one per invocation) of each
    invocation's share of a matrix. The mapping is the implementation's choice; this one
    deals the elements out round-robin. (Indices through a pointer were checked by the
    access chain, for the invocations that made it.)"""
    length = t.rows * t.cols // w.sg
    e = np.asarray(e, np.int64)
    if check and np.any((e < 0) | (e >= length)):
        raise UndefinedBehavior(f"element {e} of a matrix with {length} per invocation")
    return np.clip(e, 0, length - 1) * w.sg + w.lane


@_plain(Op.VectorShuffle)
def _vector_shuffle(w: Wave, ins: Ins, mask: Mask) -> None:
    """Components picked by literal index from Vector 1's components followed by Vector
    2's; 0xFFFFFFFF leaves a component undefined (garbage here)."""
    t = _rtype(ins)
    assert isinstance(t, VectorT)
    x, y, *picks = ins.args
    parts = []
    for a in (x, y):
        at = w.type_of(a)
        if not isinstance(at, VectorT) or type(at.component) is not type(t.component):
            raise UndefinedBehavior(f"{ins}: operand %{a} is not a vector of the result's "
                                    f"component type")
        parts.append(w.lanes(w.val(a), at))
    both = np.concatenate(parts, axis=-1)
    if len(picks) != t.count or any(p >= both.shape[-1] and p != 0xFFFFFFFF for p in picks):
        raise UndefinedBehavior(f"{ins}: component selectors do not fit the vectors")
    cols = [both[:, p] if p != 0xFFFFFFFF else _garbage(both.dtype, (w.n,)) for p in picks]
    w.put(ins, np.stack(cols, axis=-1).astype(np_dtype(t), copy=False), mask)


@_plain(Op.CompositeConstruct)
def _composite_construct(w: Wave, ins: Ins, mask: Mask) -> None:
    t = _rtype(ins)
    parts = [np.asarray(w.val(a)) for a in ins.args]
    if isinstance(t, CoopMatT):
        if len(parts) != 1:
            raise UndefinedBehavior(f"{ins}: a matrix is built from one constituent")
        w.tangled(mask, ins)
        v = w.per_subgroup(parts[0], mask, f"{ins}'s constituent")
        out = np.broadcast_to(v.astype(np_dtype(t))[:, None, None], (w.S, t.rows, t.cols))
        w.put(ins, np.array(out), mask)
        return
    if not isinstance(t, VectorT):
        raise Unsupported(f"{ins} of {type(t).__name__}")
    types = [w.type_of(a) for a in ins.args]
    per_lane = any(p.ndim > lane_ndim(pt) for p, pt in zip(parts, types, strict=True))
    lead = (w.n,) if per_lane else ()
    cols = []
    for p, pt in zip(parts, types, strict=True):
        k = pt.count if isinstance(pt, VectorT) else 1
        cols.append(np.broadcast_to(p.reshape(p.shape[:p.ndim - lane_ndim(pt)] + (k,)),
                                    lead + (k,)))
    out = np.concatenate(cols, axis=-1).astype(np_dtype(t))
    if out.shape[-1] != t.count:
        raise UndefinedBehavior(f"{ins}: {out.shape[-1]} components for a {t.count}-vector")
    w.put(ins, out, mask)


@handles(Op.CompositeExtract)
def _composite_extract(ins: Ins, mod: Module) -> Run:
    t = mod.value_types[ins.args[0]]
    if len(ins.args) != 2:
        raise Unsupported(f"{ins} with nested indices")
    x, i = ins.args
    put = _setter(ins)
    if isinstance(t, VectorT):
        if i >= t.count:
            raise UndefinedBehavior(f"{ins}: component {i} of a {t.count}-vector")
        return lambda w, mask: put(w, w.values[x][..., i], mask)
    if isinstance(t, CoopMatT):
        def element(w: Wave, mask: Mask) -> None:
            flat = _matrix_element_index(w, t, i)
            mats = np.broadcast_to(w.values[x], (w.S, t.rows, t.cols)).reshape(w.S, -1)
            put(w, mats[w.subgroup, flat], mask)
        return element
    raise Unsupported(f"{ins} of {type(t).__name__}")


@_plain(Op.CompositeInsert)
def _composite_insert(w: Wave, ins: Ins, mask: Mask) -> None:
    t = _rtype(ins)
    obj = np.asarray(w.val(ins.args[0]))
    comp = np.asarray(w.val(ins.args[1]))
    if len(ins.args) != 3:
        raise Unsupported(f"{ins} with nested indices")
    i = ins.args[2]
    if isinstance(t, VectorT):
        if i >= t.count:
            raise UndefinedBehavior(f"{ins}: component {i} of a {t.count}-vector")
        per_lane = obj.ndim > 0 or comp.ndim > 1
        out = np.array(np.broadcast_to(comp, ((w.n,) if per_lane else ()) + (t.count,)))
        out[..., i] = obj
        w.put(ins, out, mask)
    elif isinstance(t, CoopMatT):
        flat = _matrix_element_index(w, t, i)
        mats = np.array(np.broadcast_to(comp, (w.S, t.rows, t.cols))).reshape(w.S, -1)
        lanes = mask.lanes
        mats[w.subgroup[lanes], flat[lanes]] = w.lanes(obj, t.component)[lanes]
        w.put(ins, mats.reshape(w.S, t.rows, t.cols), mask)
    else:
        raise Unsupported(f"{ins} of {type(t).__name__}")


@_plain(Op.CopyObject)
def _copy(w: Wave, ins: Ins, mask: Mask) -> None:
    w.put(ins, w.val(ins.args[0]), mask)


@_plain(Op.Undef)
def _undef(w: Wave, ins: Ins, mask: Mask) -> None:
    w.put(ins, w.garbage(_rtype(ins)), mask)


@_plain(Op.CooperativeMatrixLengthKHR)
def _length(w: Wave, ins: Ins, mask: Mask) -> None:
    t = w.mod.types.get(ins.args[0])
    if not isinstance(t, CoopMatT):
        raise UndefinedBehavior(f"{ins}: the operand must be a cooperative matrix type")
    w.put(ins, np.array(t.rows * t.cols // w.sg, np.uint32), mask)


# -- memory ------------------------------------------------------------------------------------
def _memory_operands(mod: Module, ins: Ins, words: list[int], *, load: bool) -> MemoryOperands:
    if not words:
        return MemoryOperands()
    flags, rest = MemoryAccess(words[0]), list(words[1:])
    known = (MemoryAccess.Aligned | MemoryAccess.Nontemporal | MemoryAccess.MakePointerAvailable
             | MemoryAccess.MakePointerVisible | MemoryAccess.NonPrivatePointer)
    if flags & ~known:
        raise Unsupported(f"{ins}: memory operands {flags!r}")
    aligned = available = visible = None
    if flags & MemoryAccess.Aligned:
        aligned = rest.pop(0)
    if flags & MemoryAccess.MakePointerAvailable:
        if load:
            raise UndefinedBehavior(f"{ins}: MakePointerAvailable on a load")
        available = mod.const_int(rest.pop(0))
    if flags & MemoryAccess.MakePointerVisible:
        if not load:
            raise UndefinedBehavior(f"{ins}: MakePointerVisible on a store")
        visible = mod.const_int(rest.pop(0))
    non_private = bool(flags & MemoryAccess.NonPrivatePointer)
    if (available is not None or visible is not None) and not non_private:
        raise UndefinedBehavior(f"{ins}: MakePointerAvailable/Visible without NonPrivatePointer")
    if rest:
        raise InterpreterError(f"{ins}: extra operands {rest}")
    return MemoryOperands(aligned, available, visible, non_private)


def _scalar_layout(t: Type, ins: Ins) -> tuple[np.dtype, int]:
    """(component dtype, components) of a scalar or vector in memory."""
    if isinstance(t, (IntT, FloatT)):
        return np_dtype(t), 1
    if isinstance(t, VectorT) and isinstance(t.component, (IntT, FloatT)):
        return np_dtype(t), t.count
    raise Unsupported(f"{ins}: memory access of a whole {type(t).__name__}")


def _pointee(mod: Module, ptr_id: int, ins: Ins) -> Type:
    pt = mod.value_types.get(ptr_id)
    if not isinstance(pt, PointerT):
        raise UndefinedBehavior(f"{ins}: %{ptr_id} is not a pointer")
    return pt.pointee


@handles(Op.Variable)
def _function_variable(ins: Ins, mod: Module) -> Run:
    ptr = _rtype(ins)
    assert isinstance(ptr, PointerT)
    if ins.args[0] != StorageClass.Function:
        raise InterpreterError(f"{ins}: a variable in a function must be in Function storage")
    init = ins.args[1] if len(ins.args) > 1 else None

    def run(w: Wave, mask: Mask) -> None:
        # A fresh variable for each execution of the function (the inactive invocations
        # are not in this activation).
        value = w.val(init) if init is not None else w.garbage(ptr.pointee)
        w.values[ins.rid] = Ptr(Local(ptr.pointee, value), ptr.pointee)
    return run


@handles(Op.Load)
def _load(ins: Ins, mod: Module) -> Run:
    src = ins.args[0]
    t = _pointee(mod, src, ins)
    if t is not ins.rtype:
        raise UndefinedBehavior(f"{ins}: the result type is not the pointee type")
    ops = _memory_operands(mod, ins, ins.args[1:], load=True)
    put = _setter(ins)
    in_memory = isinstance(t, (IntT, FloatT, VectorT))
    dt, count = _scalar_layout(t, ins) if in_memory else (np.dtype(np.uint8), 0)
    size = dt.itemsize
    comp = np.arange(count, dtype=np.int64) * size
    comp_bytes = (comp[:, None] + np.arange(size)).reshape(-1)

    def run(w: Wave, mask: Mask) -> None:
        p: Ptr = w.values[src]
        if isinstance(p.target, Local):
            put(w, w.local_get(p, mask), mask)
            return
        mem: Memory = p.target
        if not in_memory:
            raise Unsupported(f"{ins}: memory access of a whole {type(t).__name__}")
        offset = np.asarray(p.offset, np.int64)
        if ops.aligned and w.active(mask, offset % ops.aligned != 0):
            raise UndefinedBehavior(f"{ins}: the pointer is not aligned to {ops.aligned}")
        if offset.ndim == 0 and not mem.track:  # one address for all: read it once
            value = mem.read(offset + comp, dt)
            put(w, value if count > 1 else value[0], mask)
            return
        lanes = mask.lanes
        base = offset[lanes] if offset.ndim else np.full(mask.count, offset)
        values = mem.read(base[:, None] + comp, dt)
        if mem.track:
            mem.on_read(base[:, None] + comp_bytes, w.owner[lanes], ops.visible,
                        ops.non_private, w.sg)
        if mask.full:
            out = values
        else:
            out = np.zeros((w.n, count), dt)
            out[lanes] = values
        put(w, out if count > 1 else out[:, 0], mask)
    return run


@handles(Op.Store)
def _store(ins: Ins, mod: Module) -> Run:
    dst, src = ins.args[0], ins.args[1]
    t = _pointee(mod, dst, ins)
    if mod.value_types.get(src) is not t:
        raise UndefinedBehavior(f"{ins}: the object's type is not the pointee type")
    ops = _memory_operands(mod, ins, ins.args[2:], load=False)
    in_memory = isinstance(t, (IntT, FloatT, VectorT))
    dt, count = _scalar_layout(t, ins) if in_memory else (np.dtype(np.uint8), 0)
    size = dt.itemsize
    comp = np.arange(count, dtype=np.int64) * size
    comp_bytes = (comp[:, None] + np.arange(size)).reshape(-1)

    def run(w: Wave, mask: Mask) -> None:
        p: Ptr = w.values[dst]
        value = w.values[src]
        if isinstance(p.target, Local):
            w.local_set(p, value, mask, ins)
            return
        mem: Memory = p.target
        if not in_memory:
            raise Unsupported(f"{ins}: memory access of a whole {type(t).__name__}")
        offset = np.asarray(p.offset, np.int64)
        if ops.aligned and w.active(mask, offset % ops.aligned != 0):
            raise UndefinedBehavior(f"{ins}: the pointer is not aligned to {ops.aligned}")
        lanes = mask.lanes
        base = offset[lanes] if offset.ndim else np.full(mask.count, offset)
        vals = w.lanes(value, t)[lanes].astype(dt, copy=False).reshape(mask.count, count)
        if mem.track:
            mem.on_write(base[:, None] + comp_bytes, w.owner[lanes], ops.available,
                         ops.non_private)
        mem.write(base[:, None] + comp, vals, dt)
        mem.stored["scalar"] += mask.count
    return run


def _atomic(ins: Ins, mod: Module, ptr_id: int,
            apply: Callable[[np.ndarray, np.ndarray], np.ndarray] | None,
            value_id: int | None) -> Run:
    """An atomic on one integer in a buffer: the active invocations in order, each
    reading the old value and (where `apply` is given) writing apply(old, value) back;
    the result, where the instruction has one, is each invocation's old value. Atomics
    take no part in the race and availability checks: the split-K counters, their only
    users here, are touched by nothing else."""
    t = _pointee(mod, ptr_id, ins)
    if not isinstance(t, IntT):
        raise Unsupported(f"{ins}: an atomic on a {type(t).__name__}")
    if ins.rtype is not None and ins.rtype is not t:
        raise UndefinedBehavior(f"{ins}: the result type is not the pointee type")
    dt = np_dtype(t)
    put = _setter(ins) if ins.rtype is not None else None

    def run(w: Wave, mask: Mask) -> None:
        p: Ptr = w.values[ptr_id]
        if isinstance(p.target, Local):
            raise Unsupported(f"{ins}: an atomic on a function variable")
        mem: Memory = p.target
        offset = np.asarray(p.offset, np.int64)
        lanes = mask.lanes
        base = offset[lanes] if offset.ndim else np.full(mask.count, offset)
        values = (w.lanes(w.values[value_id], t)[lanes].astype(dt, copy=False)
                  if value_id is not None else None)
        old = np.zeros(mask.count, dt)
        for i in range(mask.count):  # one after another
            at = base[i:i + 1]
            old[i] = mem.read(at, dt)[0]
            if apply is not None:
                assert values is not None
                mem.write(at, apply(old[i:i + 1], values[i:i + 1]), dt)
        if put is not None:
            out = np.zeros(w.n, dt)
            out[lanes] = old
            put(w, out, mask)
    return run


@handles(Op.AtomicIAdd)
def _atomic_iadd(ins: Ins, mod: Module) -> Run:
    ptr, _scope, _semantics, value = ins.args
    return _atomic(ins, mod, ptr, lambda old, v: old + v, value)


@handles(Op.AtomicStore)
def _atomic_store(ins: Ins, mod: Module) -> Run:
    ptr, _scope, _semantics, value = ins.args
    return _atomic(ins, mod, ptr, lambda old, v: v, value)


@handles(Op.AtomicLoad)
def _atomic_load(ins: Ins, mod: Module) -> Run:
    ptr, _scope, _semantics = ins.args
    return _atomic(ins, mod, ptr, None, None)


@handles(Op.AccessChain, Op.InBoundsAccessChain)
def _access_chain(ins: Ins, mod: Module) -> Run:
    """The walk through the types is done here, once: constant indices fold into one
    byte offset; each runtime index becomes (id, stride, bound, signed dtype)."""
    base_id = ins.args[0]
    t = _pointee(mod, base_id, ins)
    base_var = mod.variables.get(base_id)
    local_base = (base_var is not None and base_var.storage in (
        StorageClass.Input, StorageClass.Private)) or isinstance(
        mod.value_types.get(base_id), PointerT) and _is_function_pointer(mod, base_id)
    put = _setter(ins)
    if local_base:
        # (id, bound, signed dtype, whether the bound is a matrix's elements, which the
        # subgroup size divides among the invocations)
        indices: list[tuple[int, int, np.dtype, bool]] = []
        for index_id in ins.args[1:]:
            it = _int_type(mod.value_types[index_id], ins)
            shared = isinstance(t, CoopMatT)
            if isinstance(t, ArrayT):
                count, t = t.length, t.element
            elif isinstance(t, VectorT):
                count, t = t.count, t.component
            elif isinstance(t, CoopMatT):  # this invocation's elements of the matrix
                count, t = t.rows * t.cols, t.component
            else:
                raise Unsupported(f"{ins}: indexing a variable's {type(t).__name__}")
            indices.append((index_id, count, int_dtype(it.width, True), shared))
        leaf = t

        def local(w: Wave, mask: Mask) -> None:
            b: Ptr = w.values[base_id]
            path = list(b.path)
            for index_id, count, sdt, shared in indices:
                index = w.values[index_id].astype(sdt).astype(np.int64)
                bound = count // w.sg if shared else count
                if w.active(mask, (index < 0) | (index >= bound)):
                    raise UndefinedBehavior(f"{ins}: index outside the {bound} elements")
                path.append(index)
            put(w, Ptr(b.target, leaf, 0, tuple(path)), mask)
        return local
    const_offset = 0
    steps: list[tuple[int, int, int | None, np.dtype]] = []
    bound: int | None
    for index_id in ins.args[1:]:
        it = _int_type(mod.value_types[index_id], ins)
        sdt = int_dtype(it.width, True)  # OpAccessChain's indices are treated as signed
        known = index_id in mod.constants
        index = int(mod.constants[index_id].astype(sdt)) if known else 0
        if isinstance(t, StructT):
            if not known:
                raise UndefinedBehavior(f"{ins}: a struct member index must be a constant")
            member_offset = t.offsets[index]
            if member_offset is None:
                raise Unsupported(f"{ins}: a struct without explicit layout")
            const_offset += member_offset
            t = t.members[index]
            continue
        if isinstance(t, (ArrayT, RuntimeArrayT)):
            stride, bound = element_stride(t), (t.length if isinstance(t, ArrayT) else None)
            t = t.element
        elif isinstance(t, VectorT):
            stride, bound = type_size(t.component), t.count
            t = t.component
        else:
            raise UndefinedBehavior(f"{ins}: indexing into {type(t).__name__}")
        if known:
            if index < 0 or (bound is not None and index >= bound):
                raise UndefinedBehavior(f"{ins}: index {index} outside the array")
            const_offset += index * stride
        else:
            steps.append((index_id, stride, bound, sdt))
    ptr_t = _rtype(ins)
    if not isinstance(ptr_t, PointerT) or ptr_t.pointee is not t:
        raise UndefinedBehavior(f"{ins}: the result type does not point to the element")
    leaf = t

    def run(w: Wave, mask: Mask) -> None:
        b: Ptr = w.values[base_id]
        offset = b.offset + const_offset
        for index_id, stride, bound, sdt in steps:
            index = w.values[index_id].astype(sdt).astype(np.int64)
            outside = (index < 0) if bound is None else ((index < 0) | (index >= bound))
            if w.active(mask, outside):
                raise UndefinedBehavior(f"{ins}: index outside the array"
                                        f"{f' of {bound}' if bound is not None else ''}")
            offset = offset + index * stride
        put(w, Ptr(b.target, leaf, offset), mask)
    return run


def _is_function_pointer(mod: Module, id_: int) -> bool:
    t = mod.value_types.get(id_)
    return isinstance(t, PointerT) and t.storage == StorageClass.Function


# -- cooperative matrices ------------------------------------------------------------------
def _matrix_access(w: Wave, ins: Ins, mask: Mask, ptr: Ptr, t: CoopMatT, layout_id: int,
                   stride_id: int | None, store: bool) -> tuple[Memory, np.ndarray, np.ndarray]:
    """(memory, active subgroups, byte offsets (active subgroups, rows, cols)) of a
    cooperative-matrix load or store, after the checks the specifications ask for."""
    act = w.tangled(mask, ins)
    if not isinstance(ptr.target, Memory) or ptr.target.storage not in (
            StorageClass.Workgroup, StorageClass.StorageBuffer):
        raise UndefinedBehavior(f"{ins}: the pointer must be to Workgroup or StorageBuffer "
                                "memory (VUID-StandaloneSpirv-Pointer-08973)")
    if not isinstance(ptr.type, (IntT, FloatT, VectorT)):
        raise UndefinedBehavior(f"{ins}: the pointer must point to a scalar or vector")
    layout = w.mod.const_int(layout_id)  # "must come from a constant instruction"
    if layout not in (CooperativeMatrixLayout.RowMajor, CooperativeMatrixLayout.ColumnMajor):
        raise Unsupported(f"{ins}: matrix layout {layout}")
    if stride_id is None:
        raise Unsupported(f"{ins} without a Stride (needed by row/column-major layouts)")
    st = _int_type(w.type_of(stride_id), ins)
    stride = w.per_subgroup(np.asarray(w.val(stride_id)).astype(
        int_dtype(st.width, st.signed)).astype(np.int64), mask, f"{ins}'s Stride")
    base = w.per_subgroup(np.asarray(ptr.offset, np.int64), mask, f"{ins}'s Pointer")
    stride, base = stride[act], base[act]
    if np.any(stride < (1 if store else 0)):
        raise UndefinedBehavior(f"{ins}: Stride {int(stride.min())} (at least "
                                f"{1 if store else 0})")
    unit = type_size(ptr.type)  # Stride counts elements of the pointee type
    cs = np_dtype(t).itemsize
    row_major = layout == CooperativeMatrixLayout.RowMajor
    # VUID-RuntimeSpirv-OpCooperativeMatrixLoadKHR-08986: Pointer and Stride aligned to
    # the lesser of 16 bytes and a row's (row-major) or column's (column-major) bytes.
    align = min(16, (t.cols if row_major else t.rows) * cs)
    if np.any(base % align) or np.any((stride * unit) % align):
        raise UndefinedBehavior(f"{ins}: Pointer (byte {int(base[0])}) or Stride "
                                f"({int(stride[0])} x {unit} bytes) not aligned to {align} "
                                "bytes")
    if store and np.any(stride * unit < (t.cols if row_major else t.rows) * cs):
        # Each location gets the store of one invocation: overlapping lines would leave
        # which element lands there undefined.
        raise UndefinedBehavior(f"{ins}: Stride {int(stride.min())} makes the matrix's "
                                "lines overlap")
    r = np.arange(t.rows)[:, None]
    c = np.arange(t.cols)[None, :]
    line, along = (r, c) if row_major else (c, r)
    at = base[:, None, None] + line * (stride[:, None, None] * unit) + along * cs
    return ptr.target, act, at


@_plain(Op.CooperativeMatrixLoadKHR)
def _matrix_load(w: Wave, ins: Ins, mask: Mask) -> None:
    t = _rtype(ins)
    if not isinstance(t, CoopMatT):
        raise UndefinedBehavior(f"{ins}: the result must be a cooperative matrix")
    ops = _memory_operands(w.mod, ins, ins.args[3:], load=True)
    stride_id = ins.args[2] if len(ins.args) > 2 else None
    mem, act, at = _matrix_access(w, ins, mask, w.val(ins.args[0]), t, ins.args[1], stride_id,
                                  store=False)
    dt = np_dtype(t)
    out = np.zeros((w.S, t.rows, t.cols), dt)
    out[act] = mem.read(at, dt)
    if mem.track:
        owners = np.repeat(w.coop_owner[act], t.rows * t.cols)
        mem.on_read(at.reshape(-1)[:, None] + np.arange(dt.itemsize), owners, ops.visible,
                    ops.non_private, w.sg)
    w.put(ins, out, mask)


@_plain(Op.CooperativeMatrixStoreKHR)
def _matrix_store(w: Wave, ins: Ins, mask: Mask) -> None:
    ptr = w.val(ins.args[0])
    t = w.type_of(ins.args[1])
    if not isinstance(t, CoopMatT):
        raise UndefinedBehavior(f"{ins}: the object must be a cooperative matrix")
    ops = _memory_operands(w.mod, ins, ins.args[4:], load=False)
    stride_id = ins.args[3] if len(ins.args) > 3 else None
    mem, act, at = _matrix_access(w, ins, mask, ptr, t, ins.args[2], stride_id, store=True)
    dt = np_dtype(t)
    value = np.broadcast_to(np.asarray(w.val(ins.args[1])), (w.S, t.rows, t.cols))[act]
    if mem.track:
        owners = np.repeat(w.coop_owner[act], t.rows * t.cols)
        mem.on_write(at.reshape(-1)[:, None] + np.arange(dt.itemsize), owners, ops.available,
                     ops.non_private)
    mem.write(at, value, dt)
    mem.stored["matrix"] += at.size


@_plain(Op.CooperativeMatrixMulAddKHR)
def _muladd(w: Wave, ins: Ins, mask: Mask) -> None:
    rt = _rtype(ins)
    ta, tb, tc = (w.type_of(i) for i in ins.args[:3])
    flags = CooperativeMatrixOperands(ins.args[3] if len(ins.args) > 3 else 0)
    if not all(isinstance(x, CoopMatT) for x in (rt, ta, tb, tc)):
        raise UndefinedBehavior(f"{ins}: operands and result must be cooperative matrices")
    assert isinstance(rt, CoopMatT) and isinstance(ta, CoopMatT)
    assert isinstance(tb, CoopMatT) and isinstance(tc, CoopMatT)
    M, N, K = rt.rows, rt.cols, ta.cols
    if (ta.use, tb.use, tc.use, rt.use) != (CooperativeMatrixUse.MatrixA,
                                            CooperativeMatrixUse.MatrixB,
                                            CooperativeMatrixUse.MatrixAccumulator,
                                            CooperativeMatrixUse.MatrixAccumulator):
        raise UndefinedBehavior(f"{ins}: wrong matrix uses")
    if (ta.rows, tb.rows, tb.cols, tc.rows, tc.cols) != (M, K, N, M, N):
        raise UndefinedBehavior(f"{ins}: shapes {ta.rows}x{ta.cols} * {tb.rows}x{tb.cols} + "
                                f"{tc.rows}x{tc.cols} -> {M}x{N}")
    if len({ta.scope, tb.scope, tc.scope, rt.scope}) != 1:
        raise UndefinedBehavior(f"{ins}: the matrices' scopes differ")
    known = (CooperativeMatrixOperands.MatrixASigned | CooperativeMatrixOperands.MatrixBSigned
             | CooperativeMatrixOperands.MatrixCSigned
             | CooperativeMatrixOperands.MatrixResultSigned)
    if flags & ~known:
        raise Unsupported(f"{ins}: cooperative matrix operands {flags!r}")
    signs = []
    for mt, bit in ((ta, CooperativeMatrixOperands.MatrixASigned),
                    (tb, CooperativeMatrixOperands.MatrixBSigned),
                    (tc, CooperativeMatrixOperands.MatrixCSigned),
                    (rt, CooperativeMatrixOperands.MatrixResultSigned)):
        signed = bool(flags & bit)
        if signed and not isinstance(mt.component, IntT):
            raise UndefinedBehavior(f"{ins}: a Signed operand for a non-integer matrix")
        signs.append(signed)
    interp = w.group.interp
    if interp.configs is not None:
        names = [component_name(x.component, s) for x, s in zip((ta, tb, tc, rt), signs,
                                                                 strict=True)]
        entry = (M, N, K, *names, rt.scope, False)
        if not any((c.m, c.n, c.k, c.a, c.b, c.c, c.result, c.scope, c.saturating) == entry
                   for c in interp.configs):
            raise UndefinedBehavior(f"{ins}: {M}x{N}x{K} {names} matches no entry of the "
                                    "device's list (VUID-RuntimeSpirv-"
                                    "OpCooperativeMatrixMulAddKHR-10060)")
    w.tangled(mask, ins)

    def wide(id_: int, t: CoopMatT, signed: bool) -> np.ndarray:
        x = np.asarray(w.val(id_))
        if isinstance(t.component, IntT):
            # Sign- or zero-extended as the operands say, whatever the type's signedness.
            return x.astype(int_dtype(t.component.width, signed)).astype(np.int64)
        return x.astype(np.float64)

    a, b, c = (wide(i, x, s) for i, x, s in zip(ins.args[:3], (ta, tb, tc), signs,
                                                 strict=False))
    # The order and internal precision are the implementation's (Vulkan): exact products
    # and sums, one rounding to the result type.
    d = np.broadcast_to(np.matmul(a, b) + c, (w.S, M, N))
    dt = np_dtype(rt)
    if isinstance(rt.component, IntT):
        # The low-order bits of the exact result (no saturating accumulation).
        d = (d & ((1 << rt.component.width) - 1)).astype(int_dtype(rt.component.width, False))
        out = d.astype(dt)
    else:
        out = d.astype(np.float32 if _via_float32(rt) else dt).astype(dt)
    w.put(ins, out, mask)


@handles(Op.ControlBarrier)
def _control_barrier(ins: Ins, mod: Module) -> Run:
    execution, memory, semantics = (mod.const_int(i) for i in ins.args[:3])
    if execution != Scope.Workgroup:
        raise Unsupported(f"{ins} with execution scope {execution}")
    token = BarrierToken(ins, memory, semantics)

    def run(w: Wave, mask: Mask) -> BarrierToken:
        if not mask.full:
            raise UndefinedBehavior(f"{ins} in control flow that not every invocation of "
                                    "the workgroup takes")
        return token
    return run


@handles(Op.FunctionCall)
def _function_call(ins: Ins, mod: Module) -> Run:
    fn = mod.functions.get(ins.args[0])
    if fn is None or len(fn.params) != len(ins.args) - 1:
        raise InterpreterError(f"{ins}: no function %{ins.args[0]} of "
                               f"{len(ins.args) - 1} parameters")
    return lambda w, mask: w.call(ins, fn, mask)  # type: ignore[return-value]


# -- OpSpecConstantOp: the handlers above, run once on constants ------------------------------
# The opcodes the SPIR-V specification allows there (for the Shader capability).
SPEC_CONSTANT_OPS = frozenset({
    Op.SConvert, Op.UConvert, Op.SNegate, Op.Not, Op.IAdd, Op.ISub, Op.IMul, Op.UDiv,
    Op.UMod, Op.ShiftRightLogical, Op.ShiftRightArithmetic, Op.ShiftLeftLogical,
    Op.BitwiseOr, Op.BitwiseXor, Op.BitwiseAnd, Op.CompositeExtract, Op.LogicalOr,
    Op.LogicalAnd, Op.LogicalNot, Op.LogicalEqual, Op.LogicalNotEqual, Op.Select, Op.IEqual,
    Op.INotEqual, Op.ULessThan, Op.SLessThan, Op.UGreaterThan, Op.SGreaterThan,
    Op.ULessThanEqual, Op.SLessThanEqual, Op.UGreaterThanEqual, Op.SGreaterThanEqual})


class _Constants:
    """Just enough of a Wave for a handler to compute on constants."""

    def __init__(self, mod: Module) -> None:
        self.values = mod.constants
        self.mod = mod

    @staticmethod
    def active(mask: Mask, cond: Any) -> bool:
        return bool(np.any(cond))


def _spec_constant_op(mod: Module, rtype: Type, rid: int, opcode: int,
                      operands: list[int]) -> np.ndarray:
    if opcode not in SPEC_CONSTANT_OPS or opcode not in HANDLERS:
        raise Unsupported(f"OpSpecConstantOp with opcode {opcode}")
    ins = Ins(opcode, rtype, rid, operands, -1)
    mod.value_types[rid] = rtype
    HANDLERS[opcode](ins, mod)(_Constants(mod), Mask(np.ones(1, bool)))  # type: ignore[arg-type]
    return np.asarray(mod.constants.pop(rid))


# Extended instruction sets: set name -> {instruction number: factory(ins, module,
# operands)}, filled by the modules that implement them (opencl.py, glsl.py). Those and
# the other handler modules (intel_mma.py, subgroup.py) register into HANDLERS when the
# package imports them (__init__.py); none of them is imported from here.
EXT_SETS: dict[str, dict[int, Callable[[Ins, Module, list[int]], Run]]] = {}


@handles(Op.ExtInst)
def _ext_inst(ins: Ins, mod: Module) -> Run:
    set_id, number, operands = ins.args[0], ins.args[1], list(ins.args[2:])
    name = mod.ext_imports.get(set_id)
    if name is None:
        raise UndefinedBehavior(f"{ins}: %{set_id} is not an imported instruction set")
    factory = EXT_SETS.get(name, {}).get(number)
    if factory is None:
        raise Unsupported(f"instruction {number} of the extended instruction set {name}")
    return factory(ins, mod, operands)
