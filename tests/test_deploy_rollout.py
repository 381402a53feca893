"""The pure parts of deployment: stable replica ids and the rolling-update planner's guarantees."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from backends.deploy.desired import ReplicaKey, desired_replicas
from backends.deploy.rollout import RolloutError, Step, execute, plan_rollout, registered_trace
from boute.specs.plan import Plan
from tests.deploy_helpers import PLAN_A, PLAN_B


def test_ids_are_stable_and_grow_by_index() -> None:
    a = desired_replicas(Plan.model_validate(PLAN_A))
    assert [k.id for k in a] == [
        "small.llama-3.1-8b.rtx-4090.tp1pp1.bf16.0",
        "small.llama-3.1-8b.rtx-4090.tp1pp1.bf16.1",
        "large.llama-3.1-70b.h100-sxm.tp4pp1.bf16.0",
    ]
    b = desired_replicas(Plan.model_validate(PLAN_B))
    kept = set(a) & set(b)
    assert {k.id for k in kept} == {"small.llama-3.1-8b.rtx-4090.tp1pp1.bf16.0"}


def test_plan_a_to_b_steps() -> None:
    a, b = desired_replicas(Plan.model_validate(PLAN_A)), desired_replicas(Plan.model_validate(PLAN_B))
    steps = plan_rollout(a, b)
    text = [str(s) for s in steps]
    # swaps: the new replica is ready and registered before the old one of its tier is deregistered
    new_large, old_large = (
        "large.llama-3.1-70b.rtx-pro-6000.tp2pp1.bf16.0",
        "large.llama-3.1-70b.h100-sxm.tp4pp1.bf16.0",
    )
    assert text.index(f"register {new_large}") < text.index(f"deregister {old_large}") < text.index(f"stop {old_large}")
    assert text.index(f"ready {new_large}") < text.index(f"register {new_large}")
    assert not any("rtx-4090.tp1pp1.bf16.0" in t for t in text)  # the shared replica is untouched
    assert text.count("publish_plan") == 1


def _keys(draw, tiers: list[str]) -> list[ReplicaKey]:
    gpus = ["rtx-4090", "h100-sxm", "rtx-5090"]
    out = []
    for t in tiers:
        for g in gpus:
            n = draw(st.integers(0, 2))
            out += [ReplicaKey(t, "m-" + t, g, index=i) for i in range(n)]
    return out


@st.composite
def fleets(draw):
    cur_tiers = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    new_tiers = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    cur, new = _keys(draw, cur_tiers), _keys(draw, new_tiers)
    # a plan deploys every tier it names (the plan validator's rule), so each tier has >= 1 replica
    cur += [ReplicaKey(t, "m-" + t, "t4") for t in cur_tiers if not any(k.tier == t for k in cur)]
    new += [ReplicaKey(t, "m-" + t, "t4") for t in new_tiers if not any(k.tier == t for k in new)]
    return cur, new


@settings(max_examples=300, deadline=None)
@given(fleets(), st.one_of(st.none(), st.integers(0, 3)))
def test_never_leaves_a_serving_tier_empty(fleet, slack) -> None:
    """With unlimited GPUs, or with only ``slack`` spare GPUs per type beyond what the old fleet uses."""
    cur, new = fleet
    capacity = None
    if slack is not None:
        capacity = {g: sum(k.gpus for k in cur if k.gpu == g) + slack for g in {k.gpu for k in cur + new}}
    steps = plan_rollout(cur, new, capacity)
    trace = registered_trace(cur, steps)
    published = steps.index(Step("publish_plan"))
    for i, counts in enumerate(trace):
        # before the new plan is live, every old tier keeps a replica; after it, every new tier does
        live_tiers = {k.tier for k in cur} if i < published else {k.tier for k in new}
        for t in live_tiers:
            assert counts.get(t, 0) >= 1, (i, steps[i], counts)
    # ready before register, and the final registered set is exactly the desired one
    seen_ready = set()
    for s in steps:
        if s.action == "ready":
            seen_ready.add(s.replica)
        if s.action == "register":
            assert s.replica in seen_ready
    final = trace[-1]
    assert {t: c for t, c in final.items() if c} == {t: sum(k.tier == t for k in new) for t in {k.tier for k in new}}


def test_executor_stops_at_first_failure() -> None:
    done: list[str] = []
    k = ReplicaKey("a", "m", "t4")

    def boom(_k: ReplicaKey | None) -> None:
        raise TimeoutError("not ready")

    ops = {
        a: (lambda key, a=a: done.append(a))
        for a in ("start", "register", "publish_plan", "deregister", "drain", "stop")
    }
    ops["ready"] = boom
    failed: list[str] = []
    try:
        execute(plan_rollout([], [k]), ops, on_fail=lambda s, e: failed.append(str(s)))
    except RolloutError as exc:
        assert "ready a.m.t4" in str(exc) and "not ready" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected RolloutError")
    assert done == ["start"] and failed == ["ready a.m.t4.tp1pp1.bf16.0"]


def _gpu_peak(cur: list[ReplicaKey], steps: list[Step]) -> dict[str, int]:
    """Most GPUs of each type held at once while the steps run (start takes them, stop gives them back)."""
    used: dict[str, int] = {}
    for k in cur:
        used[k.gpu] = used.get(k.gpu, 0) + k.gpus
    peak = dict(used)
    for s in steps:
        if s.replica is None or s.action not in ("start", "stop"):
            continue
        used[s.replica.gpu] = used.get(s.replica.gpu, 0) + (s.replica.gpus if s.action == "start" else -s.replica.gpus)
        peak[s.replica.gpu] = max(peak.get(s.replica.gpu, 0), used[s.replica.gpu])
    return peak


def test_a_fully_used_gpu_type_is_updated_break_before_make() -> None:
    """All 8 H100s hold the old large replicas; the new plan splits them into TP2 replicas and adds an
    RTX PRO 6000 one. Make-before-break cannot start a TP2 replica (no free H100), so once the new RTX
    replica serves the tier, one old H100 replica goes first -- and the tier is never empty."""
    big = [ReplicaKey("large", "70b", "h100-sxm", tp=4, index=i) for i in range(2)]
    small = [ReplicaKey("small", "8b", "rtx-4090")]
    new = [ReplicaKey("large", "70b", "h100-sxm", tp=2, index=i) for i in range(2)]
    new += [ReplicaKey("large", "70b", "rtx-pro-6000", tp=4)] + small
    capacity = {"h100-sxm": 8, "rtx-pro-6000": 4, "rtx-4090": 1}
    steps = plan_rollout(big + small, new, capacity)
    assert _gpu_peak(big + small, steps) == capacity
    assert all(c.get("large", 0) >= 1 for c in registered_trace(big + small, steps))
    text = [str(s) for s in steps]
    assert (
        text.index("register large.70b.rtx-pro-6000.tp4pp1.bf16.0")
        < text.index("deregister large.70b.h100-sxm.tp4pp1.bf16.0")
        < text.index("start large.70b.h100-sxm.tp2pp1.bf16.0")
    )
    # unlimited capacity: the same update is make-before-break throughout and needs 4 more H100s
    assert _gpu_peak(big + small, plan_rollout(big + small, new))["h100-sxm"] > 8
