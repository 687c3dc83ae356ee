"""Every plan of the recorded table (tests/data/plans_golden.json, recorded by
tests/cpu/plan_golden.py with the code before the plan became one struct attribute) recomputed with
this code, on CPU: the path, the FFI target's operand and result types and every value the
handler receives must be what they were. The old loose attributes are read from the new `plan`
and `mesh` struct attributes (OLD_NAMES below), and what the old handler derived from them
(batch, tile-rows per chunk, rotation period, expected counter values) is compared with what the
new handler's own code derives (fo_jax_check_overlap_plan, run on the CPU).

Rows that are not compared, each for a stated reason:
  - rows recorded under an environment variable that only restored an earlier program
    (FO_JAX_CE_FLAG_STREAM=0, FO_JAX_CE_ACKS_FIRST=0, FO_JAX_CE_SUM_ROWS=0,
    FO_JAX_SPIN_WAIT=1): the variables and the code paths they guarded are gone;
The measurement overrides (FO_JAX_CE_PARTS / _BOUNDS / _SPLIT_SUM / _RING / _ROUNDS / _SUM_SMS)
are OverlapConfig fields now (ENV_TO_FIELD). Where a variable was silently ignored because the
call could not take it (rounds that do not divide the band, more groups per chunk than it has
clusters), the field refuses it instead; those rows are compared without that field, and the
refusal is asserted.
"""

import jax.numpy as jnp
import numpy as np
import pytest

import fo_jax
import plan_golden
from conftest import use_gemm_table

pytestmark = pytest.mark.skipif(not fo_jax.cuda_module_available(),
                                reason="the compiled CUDA module is not built here")


@pytest.fixture(autouse=True)
def recorded_gemm_choice(monkeypatch):
    """The table was recorded before fo_jax had a fitted GEMM table (the kernel library's tile
    rule, no XLA dot for plain GEMMs): the plans' encoding is compared under that rule; the
    fitted choice has its own tests (test_gemm_choice.py, test_matmul_xla_dot.py)."""
    use_gemm_table(monkeypatch)

RECORDED = plan_golden.load()

# The recorded code's encodings of its integer attributes.
OLD_COLLECTIVE = {0: "reduce_scatter", 1: "all_reduce"}
OLD_TRANSPORT = {0: "nccl", 1: "copy_engine"}
OLD_SUM_SPLIT = {0: "one", 1: "bands", 2: "rows"}
OLD_COPY_OPTIONS_NOW = 3  # flag stream and acknowledgements first: the only program left

RESTORING = plan_golden.RESTORING_ENV
ENV_TO_FIELD = {
    "FO_JAX_CE_PARTS": ("copy_engine_chunk_groups", int),
    "FO_JAX_CE_BOUNDS": ("copy_engine_group_bounds",
                         lambda text: tuple(int(v) for v in text.split(","))),
    "FO_JAX_CE_SPLIT_SUM": ("copy_engine_sum_split", {"0": "one", "1": "bands",
                                                      "rows": "rows"}.get),
    "FO_JAX_CE_RING": ("copy_engine_ring", {"0": False, "1": True}.get),
    "FO_JAX_CE_ROUNDS": ("copy_engine_rounds", int),
    "FO_JAX_CE_SUM_SMS": ("copy_engine_sum_sms", int),
}


def _mod():
    from fo_jax import _cuda

    return _cuda.module()


def old_view(call: dict) -> dict:
    """A v2 call's attributes under the old attribute names, decoded to names where the old
    code had integer codes."""
    mod = _mod()
    plan = call["attrs"]["plan"]
    if call["target"] == "fo_jax_gemm_v2":
        return dict(batch=plan["batch"], config=plan["config"], group_begin=plan["group_begin"],
                    sm_budget=plan["sm_budget"], signal=call["attrs"]["signal"])
    gemm, mesh = plan["gemm"], call["attrs"]["mesh"]
    return dict(
        collective=mod.Collective(plan["collective"]).name,
        transport=mod.Transport(plan["transport"]).name,
        config=gemm["config"], group_begin=gemm["group_begin"], sm_budget=gemm["sm_budget"],
        nccl_max_ctas=plan["nccl_max_ctas"], rounds=plan["rounds"], ring=int(plan["ring"]),
        sum_split=mod.SumSplit(plan["sum_split"]).name, nranks=plan["axis_size"],
        process=mesh["process"], mesh_process=mesh["device_process"],
        mesh_local=mesh["device_ordinal"], mesh_rank=mesh["device_rank"],
        mesh_group=mesh["device_group"], batch=gemm["batch"], tiles_chunk=plan["tiles_chunk"])


def old_attrs(call: dict) -> dict:
    """A recorded call's attributes with its codes decoded (the same keys as old_view)."""
    a = dict(call["attrs"])
    if call["target"] == "fo_jax_gemm_ffi":
        return a
    assert a.pop("spin_wait") is False
    copy_options = a.pop("copy_options")
    a["collective"] = OLD_COLLECTIVE[a["collective"]]
    a["transport"] = OLD_TRANSPORT[a["transport"]]
    a["sum_split"] = OLD_SUM_SPLIT[a["sum_split"]]
    a["batch"] = call["derived"]["batch"]
    if a["transport"] == "copy_engine":
        assert copy_options == OLD_COPY_OPTIONS_NOW
        a["tiles_chunk"] = call["derived"]["tiles_chunk"]
    else:
        # The NCCL transport's plan carries no copy-engine program (the old defaults there
        # were unused by the handler).
        a["sum_split"] = "one"
        a["tiles_chunk"] = 0
    return a


def new_case(row: dict, dropped=()) -> dict:
    """The row's case for this code: its environment overrides as OverlapConfig fields."""
    config = dict(row["config"])
    for var, text in row["env"].items():
        field, parse = ENV_TO_FIELD[var]
        if field in dropped or field in config:
            continue  # a field given in the config took precedence over the variable
        config[field] = parse(text)
    return dict(row, config=config, env={})


def _env_ignored_rounds(row: dict) -> bool:
    """Whether the recorded call ignored FO_JAX_CE_ROUNDS (its rounds did not fit the band)."""
    if "FO_JAX_CE_ROUNDS" not in row["env"] or "copy_engine_rounds" in row["config"]:
        return False
    calls = row["result"].get("calls") or []
    attrs = calls[0]["attrs"] if calls else {}
    return (row["collective"] == "all_reduce" and attrs.get("transport") == 1
            and attrs.get("rounds") != int(row["env"]["FO_JAX_CE_ROUNDS"]))


COMPARED = [r for r in RECORDED if not r["restoring"]]


def test_the_table_covers_what_it_says():
    assert len(RECORDED) > 1000
    assert len(COMPARED) == len(RECORDED) - sum(r["restoring"] for r in RECORDED)
    paths = {r["result"].get("path") for r in COMPARED}
    assert {"cuda", "xla", "reference"} <= paths
    transports = {c["attrs"].get("transport") for r in COMPARED
                  for c in r["result"].get("calls", [])}
    assert {0, 1} <= transports


def _compare(row: dict) -> tuple:
    dropped = ()
    if _env_ignored_rounds(row):
        dropped = ("copy_engine_rounds",)
    case = new_case(row, dropped)
    got = plan_golden.record(case)
    if ("error" in got and "copy_engine_chunk_groups" in got.get("message", "")
            and "error" not in row["result"]):
        # The recorded call ignored FO_JAX_CE_PARTS (the chunks had too few clusters).
        dropped += ("copy_engine_chunk_groups",)
        got = plan_golden.record(new_case(row, dropped))
    return case, got, dropped


@pytest.mark.parametrize("row", COMPARED, ids=[r["id"] for r in COMPARED])
def test_plan_unchanged(row):
    case, got, _ = _compare(row)
    want = row["result"]
    if "error" in want:
        assert got.get("error") == want["error"], (case["id"], got)
        return
    assert "error" not in got, got
    assert got["path"] == want["path"], (got["reason"], want["reason"])
    assert len(got["calls"]) == len(want["calls"])
    for new, old in zip(got["calls"], want["calls"]):
        assert new["target"] == old["target"].replace("_ffi", "_v2")
        assert new["types"] == old["types"]
        assert old_view(new) == old_attrs(old)


@pytest.mark.parametrize("row", [r for r in COMPARED if r["result"].get("path") == "cuda"
                                 and r["op"] == "overlapped_matmul"],
                         ids=lambda r: r["id"])
def test_handler_derives_what_it_derived(row):
    """The handler's own decoding of the lowered plan and mesh table and its validation of the
    plan (run on the CPU) find the device's rank and group and derive the GEMM's batch, rows,
    tile-rows per chunk, rotation and each group's expected counter value the old handler
    derived from its attributes."""
    from fo_jax import _cuda_ops

    _, got, _ = _compare(row)
    for call, old in zip(got["calls"], row["result"]["calls"]):
        plan_attr = _as_attribute(call["attrs"]["plan"])
        mesh_attr = _as_attribute(call["attrs"]["mesh"])
        derived = old["derived"]
        mm, kk = (int(v) for v in call["types"][len("(tensor<"):].split("x")[:2])
        # The device of rank 0 in the last group.
        rows = [i for i, r in enumerate(old["attrs"]["mesh_rank"])
                if r == 0 and old["attrs"]["mesh_group"][i] == max(old["attrs"]["mesh_group"])]
        device = old["attrs"]["mesh_local"][rows[0]]
        check = _cuda_ops.check_overlap_plan(plan_attr, jnp.dtype(row["dtype"]), mm,
                                             derived["n"], kk, mesh_attr=mesh_attr,
                                             device=device)
        assert (check["rank"], check["group"]) == (0, max(old["attrs"]["mesh_group"]))
        assert check["batch"] == derived["batch"]
        assert (check["m"], check["n"], check["k"]) == (derived["m"], derived["n"], derived["k"])
        assert check["expected"] == derived["expected"]
        if "tiles_chunk" in derived:
            assert check["rotate_period_tile_rows"] == derived["rotate_period_tile_rows"]
            assert check["rotate_tile_rows"] == derived["tiles_chunk"]  # rank 0: chunk 1 first


def _as_attribute(value):
    """A parsed attribute dict back into what overlap_attribute builds."""
    if isinstance(value, dict):
        return {k: _as_attribute(v) for k, v in value.items()}
    if isinstance(value, list):
        return np.asarray(value, np.int32)
    if isinstance(value, bool):
        return value
    return np.int32(value)


def test_fields_refuse_what_the_variables_ignored():
    """FO_JAX_CE_ROUNDS and FO_JAX_CE_PARTS were ignored where the call could not take them;
    their fields are not: a copy_engine_rounds that does not fit sends the call to NCCL (or
    raises when the copy engine is required), a copy_engine_chunk_groups the chunks cannot hold
    raises at trace time."""
    ignored_rounds = [r for r in COMPARED if _env_ignored_rounds(r)]
    assert ignored_rounds
    ignored_parts = [r for r in COMPARED if "FO_JAX_CE_PARTS" in r["env"]
                     and "copy_engine_chunk_groups" in _compare(r)[2]]
    assert ignored_parts
    got = plan_golden.record(new_case(ignored_parts[0]))
    assert got.get("error") == "ValueError" and "copy_engine_chunk_groups" in got["message"]
    got = plan_golden.record(new_case(ignored_rounds[0]))
    assert [c["attrs"]["plan"]["transport"] for c in got["calls"]] == [
        _mod().Transport.nccl.value], got
