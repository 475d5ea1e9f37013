"""coopmat.dask.matmul and linear: one task per row chunk of x, each a coopmat GEMM on its
worker's device against the weight that worker keeps there."""

from __future__ import annotations

import pickle
import sys
import threading
from typing import Any

import dask.array as da
import numpy as np
from dask.delayed import delayed

import coopmat as _coopmat
from coopmat.api.matmul import matmul_to_host
from coopmat.dask.cache import weight_cache
from coopmat.dask.weights import Weight, WeightKey, weight_key

# coopmat's public names load on first use (coopmat.__getattr__), so mypy sees them as
# object: used through an Any.
coopmat: Any = _coopmat

# coopmat.matmul's default result dtypes (its docstring): the meta of the dask result.
_RESULT = {"float16": "float16", "int8": "int32", "uint8": "uint32", "bfloat16": "float32",
           "float8_e4m3fn": "float32", "float8_e5m2": "float32"}
# Keyword arguments that make no sense per chunk, and why.
_REFUSED = {
    "out": "results are new dask arrays; there is no in-place form",
    "c": "pass the addend as residual= (a dask array aligned with the result)",
    "beta": "pass the addend as residual= (a dask array aligned with the result)",
    "device": "each worker uses its own device (coopmat.dask.LocalCluster pins one per "
              "worker; without a cluster, set COOPMAT_DEVICE)",
}
_PASSED = ("dtype", "out_dtype", "accumulator", "family", "alpha")
# One GEMM at a time per process: tasks of one process that miss the weight cache together
# would each upload the weight, and products on one device gain nothing from overlapping.
# A worker's second thread holds its next task here, ready when the device is free.
DEVICE_LOCK = threading.Lock()


def result_dtype(x_dtype: np.dtype, dtype: Any) -> np.dtype:
    """The result's dtype as coopmat.matmul gives it: `dtype` if given, else float16 ->
    float16, int8 -> int32, uint8 -> uint32, bfloat16 and float8 -> float32. Other input
    dtypes keep their own (coopmat refuses them inside the task, with its own error)."""
    if dtype is not None:
        return np.dtype(dtype)
    name = _RESULT.get(np.dtype(x_dtype).name)
    if name is None:
        return np.dtype(x_dtype)
    import ml_dtypes  # noqa: F401 (np.dtype("bfloat16") needs it registered)
    return np.dtype(name)


def _round_trips(error: BaseException) -> bool:
    try:  # as distributed sends it: tblib's pickling where distributed brought it in
        import tblib.pickling_support
        tblib.pickling_support.install(error)
    except ImportError:
        pass
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return False
    return True


def _transportable(error: BaseException) -> BaseException:
    """The error itself where it survives pickling (it must reach the client), else a
    CoopmatError naming it."""
    if "distributed" not in sys.modules or _round_trips(error):
        return error  # (the threaded scheduler pickles nothing)
    return coopmat.CoopmatError(f"{type(error).__name__}: {error}")


def _on_device(weight: Any) -> Any:
    if isinstance(weight, Weight):
        return weight.on_device()
    return coopmat.asarray(weight)


def gemm_block(x: np.ndarray | list[np.ndarray], weight: Any, bias: Any, residual: Any, *,
               mode: str, weight_token: str, transposed: bool, shape: tuple[int, ...],
               options: tuple[tuple[str, Any], ...]) -> np.ndarray:
    """One task: this chunk of x times the weight this worker keeps on its device; a numpy
    chunk out (a coopmat.Array never leaves the worker). x comes as the list of its row's
    blocks along K, one block (the graph brings K to one chunk)."""
    if isinstance(x, list):
        x = x[0] if len(x) == 1 else np.concatenate(x, axis=-1)
    opts = dict(options)
    if x.size == 0 or shape[-1] == 0:
        return np.empty(x.shape[:-1] + shape[-1:],
                        result_dtype(x.dtype, opts.get("dtype", opts.get("out_dtype"))))
    try:
        with DEVICE_LOCK:
            w = weight_cache().get(weight_token, lambda: _on_device(weight))
            if transposed:
                w = w.T
            if mode == "linear":  # linear(x, w) is matmul(x, w.T)
                w = w.T
            if bias is not None:
                opts["bias"] = bias
            if residual is not None:
                opts["residual"] = residual
            return matmul_to_host(x, w, **opts)
    except coopmat.CoopmatError as e:
        error = _transportable(e)
        if error is e:
            raise
    # Raised here, not inside `except`: its __context__ (the original error) would travel
    # with it and fail to unpickle just the same.
    raise error


def _small_key(value: Any) -> Any:
    """bias (N,) as one graph key: a dask array brought to one chunk, else numpy."""
    if value is None:
        return None
    if isinstance(value, da.Array):
        return value.rechunk(value.shape).to_delayed().ravel()[0]
    host = np.asarray(value)
    from dask.base import tokenize
    return delayed(host, name=f"coopmat-bias-{tokenize(host)}", pure=True, traverse=False)


def _gemm(x: Any, wk: WeightKey, mode: str, bias: Any, activation: Any, residual: Any,
          kwargs: dict[str, Any]) -> da.Array:
    for name in kwargs:
        if name in _REFUSED:
            raise TypeError(f"coopmat.dask.{mode}: {name}= is not taken: {_REFUSED[name]}")
        if name not in _PASSED:
            raise TypeError(f"coopmat.dask.{mode}() got an unexpected keyword argument "
                            f"{name!r}")
    x = x if isinstance(x, da.Array) else da.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"coopmat.dask.{mode}: x must be at least 2-D (rows, K), not of "
                         f"shape {x.shape}")
    quantized = wk.dtype is None
    if mode == "linear":
        if quantized and wk.transposed:
            raise ValueError("coopmat.dask.linear takes the quantized weight as (N, K), not "
                             "its .T")
        n, k = wk.shape
    else:
        if quantized and not wk.transposed:
            raise ValueError("coopmat.dask.matmul takes a quantized weight (N, K) as w.T, "
                             "as coopmat.matmul does (or use coopmat.dask.linear(x, w))")
        k, n = wk.shape
    if x.shape[-1] != k:
        what = "in_features" if mode == "linear" else "rows"
        raise ValueError(f"coopmat.dask.{mode}: x has K={x.shape[-1]} but the weight has "
                         f"{k} {what} (weight shape {wk.shape})")
    x = x.rechunk({x.ndim - 1: -1})  # each task needs whole rows
    options = dict(kwargs)
    if activation is not None:
        options["activation"] = activation
    rdt = result_dtype(x.dtype, options.get("dtype", options.get("out_dtype")))
    lead = tuple(f"i{d}" for d in range(x.ndim - 1))
    args: list[Any] = [x, lead + ("k",), wk.value, None, _small_key(bias), None]
    new_axes: dict[str, int] = {}
    if residual is not None:
        r = residual if isinstance(residual, da.Array) else da.asarray(residual)
        want = tuple(x.shape[:-1]) + (n,)
        if tuple(r.shape) != want:
            raise ValueError(f"coopmat.dask.{mode}: residual has shape {tuple(r.shape)}; the "
                             f"result's is {want}")
        args += [r.rechunk({r.ndim - 1: -1}), lead + ("n",)]
    else:
        args += [None, None]
        new_axes["n"] = n
    # concatenate=False: Dask's concatenation copies even a single block into new memory
    # (a chunk's worth of page faults and copying a task), and a copy is never the array
    # that transfers keep imported; gemm_block takes the one block from its list.
    return da.blockwise(
        gemm_block, lead + ("n",), *args, new_axes=new_axes, concatenate=False,
        dtype=rdt, meta=np.empty((0,) * x.ndim, rdt), token=f"coopmat-{mode}",
        mode=mode, weight_token=wk.token, transposed=wk.transposed,
        shape=tuple(x.shape[:-1]) + (n,), options=tuple(sorted(options.items(), key=str)))


def matmul(x: Any, w: Any, *, bias: Any = None, activation: Any = None, residual: Any = None,
           **kwargs: Any) -> da.Array:
    """x @ w lazily, each row chunk of x a coopmat.matmul on its worker's device.

    - x: a dask array (..., K) of numpy chunks, chunked along the rows (K is brought to
      one chunk); a numpy array is taken as one chunk.
    - w: (K, N) a numpy array or a dask array (brought to one chunk), or `quantized(...).T`
      / `from_gguf(...).T`; it is one key of the graph, sent to each worker once and kept
      on its device across computes (coopmat.dask.cache_info).
    - bias (N,), activation, residual (the result's shape), dtype, accumulator, family,
      alpha: as coopmat.matmul's, per chunk.
    Returns a dask array of numpy chunks, rows chunked as x's, N in one chunk; dtype as
    coopmat.matmul's (float16 -> float16, int8 -> int32, ...). Errors (a dtype the device
    lacks, device memory) are coopmat's own, raised by compute().
    """
    return _gemm(x, weight_key(w), "matmul", bias, activation, residual, kwargs)


def linear(x: Any, w: Any, bias: Any = None, activation: Any = None, residual: Any = None,
           **kwargs: Any) -> da.Array:
    """act(x @ w.T + bias) + residual lazily, as coopmat.linear per row chunk of x.

    - w: (N, K) as torch keeps a Linear's weight: a numpy or dask array, or
      `quantized(w, "q4_0")` / `from_gguf(tensor)` (made on each worker's device once).
    - the rest as coopmat.dask.matmul.
    """
    if not isinstance(w, (Weight, da.Array)):
        w = np.asarray(w)
    return _gemm(x, weight_key(w), "linear", bias, activation, residual, kwargs)
