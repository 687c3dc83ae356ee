"""The CUDA plans of a table of calls, as the FFI handler receives them: recorded once into
tests/data/plans_golden.json, compared by tests/cpu/test_plan_golden.py.

Each case is lowered for the "cuda" platform from CPU devices (jax.jit(jax.shard_map(...))
.trace(x, w).lower(lowering_platforms=("cuda",))) and the record keeps which path the call takes
(from fo_jax's DEBUG log line), the FFI target it calls and every attribute of that custom call
but the group tokens (which name the NCCL unique ids; recorded when those were random and left
out since). On a machine without GPUs fo_jax sees no peer-access problem, so the copy-engine
transport is chosen wherever the shape lets it; that is what the record holds.

The file was recorded with the code before the plan became one struct attribute (loose
attributes, target fo_jax_overlapped_matmul_ffi) and is the evidence the restructured code is
compared against: tests/cpu/test_plan_golden.py reads the new `plan` and `mesh` attributes under the
old names. `python3 tests/cpu/plan_golden.py` prints the first records this code makes; `--write`
records the table again, in this code's format, which that test does not read: write it only
together with a test for the new format, when a plan is meant to change.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import re
import sys

_flag = "--xla_force_host_platform_device_count=8"
if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
import fo_jax  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parents[1] / "data" / "plans_golden.json"

DESIGN_SHAPES = [(4096, 8192, 2048), (8192, 8192, 2048), (8192, 8192, 7168),
                 (16384, 8192, 7168), (16384, 8192, 2048)]
# Small (below the overlap's floor) and odd shapes (tile padding, M / P off the tile grid,
# dimensions that are not multiples of 8).
SMALL_ODD_SHAPES = [(1024, 512, 256), (1000, 264, 520), (6144, 4096, 1024), (3072, 8192, 4096),
                    (2048, 1000, 512)]
MESHES = [(2,), (4,), (8,), (2, 2)]
COLLECTIVES = ("reduce_scatter", "all_reduce")
DTYPES = ("bfloat16", "float16")

# Environment overrides that exist only to restore earlier programs: their rows are recorded
# (the old plans) but not compared once the variables are gone.
RESTORING_ENV = ("FO_JAX_CE_FLAG_STREAM", "FO_JAX_CE_ACKS_FIRST", "FO_JAX_CE_SUM_ROWS",
                 "FO_JAX_SPIN_WAIT")


def _case(op, collective, dtype, mesh, shape, config=None, env=None):
    m, n, k = shape
    cid = f"{op}/{collective}/{dtype}/{'x'.join(map(str, mesh))}/{m}x{n}x{k}"
    if config:
        cid += "/" + ",".join(f"{a}={b}" for a, b in sorted(config.items()))
    if env:
        cid += "/" + ",".join(f"{a}={b}" for a, b in sorted(env.items()))
    return dict(id=cid, op=op, collective=collective, dtype=dtype, mesh=list(mesh), m=m, n=n, k=k,
                config=dict(config or {}), env=dict(env or {}),
                restoring=any(v in (env or {}) for v in RESTORING_ENV))


def cases() -> list:
    out = []
    for mesh in MESHES:
        for coll in COLLECTIVES:
            for dtype in DTYPES:
                for shape in DESIGN_SHAPES:
                    out.append(_case("overlapped_matmul", coll, dtype, mesh, shape))
                for shape in SMALL_ODD_SHAPES:
                    out.append(_case("overlapped_matmul", coll, dtype, mesh, shape))
                    out.append(_case("overlapped_matmul", coll, dtype, mesh, shape,
                                     dict(allow_fallback=False)))
    # OverlapConfig variants.
    variants = [
        dict(transport="nccl"), dict(transport="copy_engine"),
        dict(num_groups=2), dict(num_groups=6), dict(num_groups=1),
        dict(sm_budget=100), dict(sm_budget=120, transport="copy_engine"),
        dict(nccl_max_ctas=16), dict(transport="nccl", sm_budget=116, nccl_max_ctas=12),
        dict(copy_engine_rounds=1), dict(copy_engine_rounds=2), dict(copy_engine_rounds=4),
        dict(copy_engine_rounds=2, sm_budget=124),
        dict(gemm_config="pp_128x128x64_c1"), dict(gemm_config="coop_128x256x64_c2"),
        dict(gemm_config="pp_128x192x64_c2", transport="nccl"),
        dict(gemm_config="coop_256x128x64_c1", transport="copy_engine"),
        dict(gemm_config="pp_128x128x64_c2", group_tile_rows=(4, 4, 8)),
        dict(gemm_config="pp_128x128x64_c2", group_tile_rows=(1, 15)),
        dict(gemm_config="pp_128x128x64_c2", group_tile_rows=(16, 16, 16, 16)),
        dict(gemm_config="pp_128x128x64_c2", group_tile_rows=(8, 8, 16)),
        dict(gemm_config="pp_128x128x64_c2", group_tile_rows=(2, 30)),
        dict(force_reference=True),
    ]
    for mesh in [(2,), (4,), (2, 2)]:
        for coll in COLLECTIVES:
            for shape in [(8192, 8192, 2048), (8192, 8192, 7168)]:
                for v in variants:
                    out.append(_case("overlapped_matmul", coll, "bfloat16", mesh, shape, v))
    # Measurement overrides read from the environment.
    envs = [
        dict(FO_JAX_CE_PARTS="1"), dict(FO_JAX_CE_PARTS="2"), dict(FO_JAX_CE_PARTS="3"),
        dict(FO_JAX_CE_PARTS="4", FO_JAX_CE_RING="0"),
        dict(FO_JAX_CE_RING="0"), dict(FO_JAX_CE_RING="1"),
        dict(FO_JAX_CE_RING="0", FO_JAX_CE_SPLIT_SUM="0"),
        dict(FO_JAX_CE_RING="0", FO_JAX_CE_SPLIT_SUM="1"),
        dict(FO_JAX_CE_RING="0", FO_JAX_CE_SPLIT_SUM="rows"),
        dict(FO_JAX_CE_SPLIT_SUM="rows"),
        dict(FO_JAX_CE_RING="0", FO_JAX_CE_BOUNDS="0,8,16,32,40,48,64"),
        dict(FO_JAX_CE_RING="0", FO_JAX_CE_BOUNDS="0,8,16,32,40,48,64", FO_JAX_CE_SPLIT_SUM="1"),
        dict(FO_JAX_CE_BOUNDS="0,4,10,16,22,32,36,48,64"),
        dict(FO_JAX_CE_ROUNDS="1"), dict(FO_JAX_CE_ROUNDS="2"), dict(FO_JAX_CE_ROUNDS="4"),
        dict(FO_JAX_CE_ROUNDS="3"),
        dict(FO_JAX_CE_ROUNDS="2", FO_JAX_CE_SUM_SMS="4"), dict(FO_JAX_CE_SUM_SMS="16"),
        dict(FO_JAX_CE_ROUNDS="4", FO_JAX_CE_SUM_SMS="12", FO_JAX_CE_PARTS="2"),
        # Restoring earlier programs (recorded, not compared).
        dict(FO_JAX_CE_FLAG_STREAM="0"), dict(FO_JAX_CE_ACKS_FIRST="0"),
        dict(FO_JAX_CE_RING="0", FO_JAX_CE_SUM_ROWS="0"), dict(FO_JAX_SPIN_WAIT="1"),
    ]
    for mesh in [(2,), (4,), (8,)]:
        for coll in COLLECTIVES:
            for dtype in DTYPES:
                for shape in [(8192, 8192, 2048), (8192, 8192, 7168)]:
                    for e in envs:
                        out.append(_case("overlapped_matmul", coll, dtype, mesh, shape, env=e))
    # The env overrides combined with a config.
    for e in [dict(FO_JAX_CE_ROUNDS="2"), dict(FO_JAX_CE_SUM_SMS="4", FO_JAX_CE_ROUNDS="2"),
              dict(FO_JAX_CE_PARTS="2")]:
        for v in [dict(copy_engine_rounds=4), dict(sm_budget=110), dict(transport="nccl")]:
            out.append(_case("overlapped_matmul", "all_reduce", "bfloat16", (4,),
                             (8192, 8192, 7168), v, e))
    # The plain GEMM.
    for dtype in DTYPES:
        for shape in DESIGN_SHAPES + SMALL_ODD_SHAPES + [(8, 8, 8), (24, 40, 56)]:
            out.append(_case("matmul", None, dtype, (), shape))
        for v in [dict(gemm_config="coop_128x128x64_c1"), dict(sm_budget=66),
                  dict(num_groups=3), dict(gemm_config="pp_128x128x64_c2",
                                           group_tile_rows=(60, 4)),
                  dict(force_reference=True)]:
            out.append(_case("matmul", None, dtype, (), (8192, 8192, 2048), v))
    return out


@contextlib.contextmanager
def _environment(env: dict):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class _PathLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.paths = []

    def emit(self, record):
        found = re.search(r"path=(\w+) \((.*)\)$", record.getMessage())
        if found:
            self.paths.append((found.group(1), found.group(2)))


# --- MLIR attribute text -> JSON values -------------------------------------------------------

_TOKEN = re.compile(r'\s*(?:(\{)|(\})|(\[)|(\])|(,)|(=)|("(?:[^"\\]|\\.)*")|'
                    r'(array<\w+(?::[^>]*)?>)|(dense<[^>]*>\s*:\s*tensor<[^>]*>)|'
                    r'(-?\d+)\s*:\s*(\w+)|(true|false)|([\w.$]+))')


def _tokens(text):
    pos = 0
    while pos < len(text):
        mt = _TOKEN.match(text, pos)
        if not mt:
            if text[pos:].strip() == "":
                return
            raise ValueError(f"cannot parse attributes at {text[pos:pos + 60]!r}")
        pos = mt.end()
        yield mt


def _dense(text):
    """dense<...> : tensor<NxT> -> a list of ints (a splat repeated N times)."""
    body, shape = re.match(r"dense<(.*)>\s*:\s*tensor<(.*)>", text).groups()
    count = int(np.prod([int(d) for d in shape.split("x")[:-1]]))
    if body.startswith('"0x'):
        raise ValueError("hex dense attributes are not recorded")
    values = json.loads(body)
    return values if isinstance(values, list) else [values] * count


def _value(toks, first):
    g = first.groups()
    if g[0]:
        return _dict(toks)
    if g[2]:
        items = []
        while True:
            t = next(toks)
            if t.group(4):
                return items
            if t.group(5):
                continue
            items.append(_value(toks, t))
    if g[6]:
        return json.loads(g[6])
    if g[7]:
        body = g[7][len("array<"):-1]
        if ":" not in body:
            return []
        return [int(v) for v in body.split(":", 1)[1].split(",") if v.strip()]
    if g[8]:
        return _dense(g[8])
    if g[9]:
        return int(g[9])
    if g[11]:
        return g[11] == "true"
    raise ValueError(f"unexpected token {first.group(0)!r}")


def _dict(toks):
    out = {}
    while True:
        t = next(toks)
        if t.group(2):
            return out
        if t.group(5):
            continue
        key = t.group(13) or json.loads(t.group(7))
        eq = next(toks)
        assert eq.group(6), eq.group(0)
        out[key] = _value(toks, next(toks))


def parse_attr_dict(text: str) -> dict:
    toks = _tokens(text)
    first = next(toks)
    assert first.group(1), text[:40]
    return _dict(toks)


def _balanced(text: str, start: int) -> str:
    """The {...} starting at text[start]."""
    depth, i, quoted = 0, start, False
    while i < len(text):
        c = text[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[start:i + 1]
        i += 1
    raise ValueError("unbalanced braces")


def fo_jax_custom_calls(text: str) -> list:
    """[(target, backend_config dict, operand and result types)] of every fo_jax custom call in
    the lowered module."""
    found = []
    for mt in re.finditer(r"stablehlo\.custom_call @(fo_jax_\w+)\(", text):
        at = text.index("backend_config = {", mt.end()) + len("backend_config = ")
        attrs = _balanced(text, at)
        attrs = re.sub(r'group_tokens = dense<[^>]*> : tensor<\d+xui8>',
                       'group_tokens = 0 : i32', attrs)
        line_end = text.index("\n", at)
        rest = text[text.index("}", at + len(attrs) - 1) + 1:line_end]
        types = rest[rest.index(": (") + 2:].strip() if ": (" in rest else rest.strip()
        found.append((mt.group(1), parse_attr_dict(attrs), types))
    return found


# --- lowering one case -------------------------------------------------------------------------

def _mesh(shape):
    devices = np.array(jax.devices("cpu")[:int(np.prod(shape))])
    names = ("tp",) if len(shape) == 1 else ("data", "tp")
    return Mesh(devices.reshape(shape), names)


def lower_case(case: dict) -> str:
    dtype = jnp.dtype(case["dtype"])
    config = fo_jax.OverlapConfig(**case["config"]) if case["config"] else None
    m, n, k = case["m"], case["n"], case["k"]
    if case["op"] == "matmul":
        f = jax.jit(lambda x, w: fo_jax.matmul(x, w, config=config))
        x, w = jax.ShapeDtypeStruct((m, k), dtype), jax.ShapeDtypeStruct((k, n), dtype)
        return f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()
    mesh = _mesh(case["mesh"])
    data = "data" if len(case["mesh"]) == 2 else None
    d = mesh.shape["data"] if data else 1
    tp = mesh.shape["tp"]
    coll = case["collective"]
    out_spec = (P((data, "tp") if data else "tp", None) if coll == "reduce_scatter"
                else P(data, None))
    f = jax.jit(jax.shard_map(
        lambda x, w: fo_jax.overlapped_matmul(x, w, axis_name="tp", collective=coll,
                                              config=config),
        mesh=mesh, in_specs=(P(data, "tp"), P("tp", None)), out_specs=out_spec))
    x = jax.ShapeDtypeStruct((m * d, k * tp), dtype)
    w = jax.ShapeDtypeStruct((k * tp, n), dtype)
    return f.trace(x, w).lower(lowering_platforms=("cuda",)).as_text()


def record(case: dict) -> dict:
    """What the handler receives for `case`: path, reason, FFI target(s) and attributes (group
    tokens left out), or the trace-time error."""
    log = logging.getLogger("fo_jax")
    handler = _PathLog()
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        with _environment(case["env"]):
            text = lower_case(case)
    except (ValueError, TypeError) as e:
        return dict(error=type(e).__name__, message=str(e))
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    calls = []
    for target, attrs, types in fo_jax_custom_calls(text):
        attrs = {key: val for key, val in attrs.items() if key != "group_tokens"}
        calls.append(dict(target=target, attrs=attrs, types=types))
    path, reason = handler.paths[-1] if handler.paths else (None, None)
    for call in calls:
        if call["target"] == "fo_jax_overlapped_matmul_ffi":
            call["derived"] = derived_by_handler(call)
    return dict(path=path, reason=reason, calls=calls)


def derived_by_handler(call: dict) -> dict:
    """What the overlap handler of the recorded code derived from its attributes and operand
    shapes (csrc/ffi/overlap_ffi.cc before the plan became one struct): the GEMM's batch and rows
    per batch, a copy-engine call's tile-rows per chunk and rotation period, and each group's
    expected counter value."""
    from fo_jax import _plan

    a = call["attrs"]
    (mm, kk), (_, nn) = [tuple(int(d) for d in t.split("x")[:-1])
                         for t in re.findall(r"tensor<([^>]*)>", call["types"])[:2]]
    nranks, rounds, gb = a["nranks"], a["rounds"], a["group_begin"]
    rs, ce = a["collective"] == 0, a["transport"] == 1
    c = _plan.gemm_configs()[a["config"]]
    batch = nranks if rs and not ce else 1
    out = dict(batch=batch, m=mm // batch, n=nn, k=kk,
               expected=[batch * (gb[g + 1] - gb[g]) * -(-nn // c["tile_n"])
                         for g in range(len(gb) - 1)])
    if ce:
        tiles_chunk = mm // nranks // rounds // c["tile_m"]
        out.update(tiles_chunk=tiles_chunk,
                   rotate_period_tile_rows=nranks * tiles_chunk if rounds > 1 else 0,
                   flag_stream=bool(a["copy_options"] & 1), acks_first=bool(a["copy_options"] & 2))
    return out


def compute_all() -> list:
    from fo_jax import _bootstrap

    _bootstrap._unique_ids.clear()
    rows = []
    for case in cases():
        rows.append(dict(case, result=record(case)))
    return rows


def dump(rows: list) -> str:
    """One case per line (a readable diff when a plan changes)."""
    return "[\n" + ",\n".join(json.dumps(r, sort_keys=True) for r in rows) + "\n]\n"


def load() -> list:
    return json.loads(GOLDEN.read_text())


def main(argv):
    if not fo_jax.cuda_module_available():
        raise SystemExit("plan_golden: needs the compiled CUDA module (fo_jax/_fo_jax_cuda*.so)")
    rows = compute_all()
    if "--write" in argv:
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(dump(rows))
        print(f"wrote {len(rows)} cases to {GOLDEN}")
    else:
        print(json.dumps(rows[:3], indent=1))
        print(f"... {len(rows)} cases")


if __name__ == "__main__":
    main(sys.argv[1:])
