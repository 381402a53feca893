"""Prefix-affinity balancing in the gateway: the balancer's use of the rule (off: exactly least load; imbalance:
the least loaded; a replica taken out or removed: only its prefixes move), then over real HTTP in front of
emulated replicas (shared system prompts stay on one replica each; a killed replica fails no request)."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter, defaultdict
from typing import Any

import httpx
import pytest

from boute.serving import BackendSpec
from boute.sim.affinity import AFFINITY, NEW_PREFIX, PromptKeys, prompt_keys, render_messages, rendezvous
from boute.specs.balancing import Affinity
from boute.specs.plan import Plan
from router.balancer import Balancer
from router.config import Settings
from tests.closed_loop import ClosedLoop
from tests.stack import TEST_PLAN, Stack
from tests.waits import SAFETY_S

GPUS = ["h100-sxm", "rtx-4090", "h100-sxm", "rtx-4090", "h100-sxm"]
SPECS = [BackendSpec(url=f"http://r{i}:1", tier="small", model="llama-3.1-8b", gpu=gpu) for i, gpu in enumerate(GPUS)]


def _balancer(
    affinity: dict[str, Any] | None, override: bool | None = None, specs: list[BackendSpec] = SPECS
) -> Balancer:
    plan = Plan.model_validate({**TEST_PLAN, "affinity": affinity} if affinity is not None else TEST_PLAN)
    bal = Balancer(Settings(cooldown_s=60.0, affinity=override))
    bal.configure(plan, specs)
    return bal


def _keys(text: str) -> PromptKeys:
    return prompt_keys(text, Affinity())


def test_with_affinity_off_every_pick_is_the_least_load_rule() -> None:
    """Off (no section; a section with enabled false; the gateway's override false), a pick with the prompt's
    keys is the pick without them, on random loads, health and exclusions: exactly the least-load rule."""
    rng = random.Random(0)
    reference = _balancer(None)
    offs = [_balancer({"enabled": False}), _balancer({}, override=False)]
    assert reference.affinity is None and all(b.affinity is None for b in offs)
    for _ in range(500):
        out = [rng.randint(0, 20) for _ in SPECS]
        down = {i for i in range(len(SPECS)) if rng.random() < 0.2}
        excluded = {i for i in range(len(SPECS)) if rng.random() < 0.2}
        picks = []
        for bal in (reference, *offs):
            reps = bal.pools["small"]
            for i, r in enumerate(reps):
                r.outstanding, r.open_until = out[i], (1e12 if i in down else 0.0)
            exclude = tuple(reps[i] for i in sorted(excluded))
            picked = bal.pick("small", exclude, _keys(f"prompt {rng.random()}" * 20) if bal is not reference else None)
            picks.append(None if picked is None else reps.index(picked))
        assert picks[0] == picks[1] == picks[2]
        open_ = [i for i in range(len(SPECS)) if i not in down and i not in excluded]
        if open_:
            reps = reference.pools["small"]
            least = min((reps[i].outstanding + 1) * reps[i].inv_weight for i in open_)
            assert picks[0] is not None and (reps[picks[0]].outstanding + 1) * reps[picks[0]].inv_weight == least
        else:
            assert picks[0] is None


def test_an_imbalanced_tier_gets_the_least_loaded_replica_whatever_the_prefix() -> None:
    rng = random.Random(1)
    bal = _balancer({"balance_abs": 4, "balance_rel": 1.5})
    reps = bal.pools["small"]
    seen: Counter[str] = Counter()
    for n in range(400):
        keys = _keys(f"system prompt {n % 3} " * 30 + f"question {n}")
        base, spread = rng.randint(0, 30), rng.choice([3, 20])
        for r in reps:
            r.outstanding = round(r.weight * (base + rng.randint(0, spread)))  # per unit of capacity
        loads = [r.outstanding / r.weight for r in reps]
        picked = bal.pick("small", (), keys)
        assert picked is not None
        if max(loads) - min(loads) > 4 and max(loads) > 1.5 * min(loads):
            least = min((r.outstanding + 1) * r.inv_weight for r in reps)
            assert (picked.outstanding + 1) * picked.inv_weight == least
            seen["imbalanced"] += 1
        else:
            seen["balanced"] += 1
    assert seen["imbalanced"] > 50 and seen["balanced"] > 20


def _homes(bal: Balancer, prompts: list[PromptKeys]) -> list[str]:
    """Where each prompt goes now, the tier idle (each pick recorded, as the gateway's are)."""
    out = []
    for keys in prompts:
        r = bal.pick("small", (), keys)
        assert r is not None
        out.append(r.id)
    return out


def test_a_tripped_or_removed_replica_loses_only_its_own_prefixes_and_returns_without_a_flood() -> None:
    calls: list[str] = []
    bal = _balancer({})
    bal._on_route = lambda tier, reason, matched, chars: calls.append(reason)
    prompts = [_keys(f"system prompt number {i}: " * 40 + "question") for i in range(200)]
    before = _homes(bal, prompts)
    assert calls.count(NEW_PREFIX) == 200 and len(set(before)) == len(SPECS)  # rendezvous spread them all
    assert _homes(bal, prompts) == before and calls.count(AFFINITY) == 200  # and they stay
    victim = bal.by_id[before[0]]
    bal.failure(victim, refused=True)  # its circuit opens: out, and forgotten
    during = _homes(bal, prompts)
    for b, d in zip(before, during, strict=True):
        assert d != victim.id and (d == b or b == victim.id)  # only the victim's prefixes moved
    victim.open_until = 0.0  # the cooldown is over: it is back, with none of its old prefixes sent back
    assert _homes(bal, prompts) == during
    fresh = [_keys(f"a new system prompt {i}: " * 40) for i in range(200)]
    share = Counter(_homes(bal, fresh))[victim.id] / 200
    assert share == pytest.approx(victim.weight / sum(r.weight for r in bal.pools["small"]), abs=0.1)
    # a registry update that drops one replica keeps everyone else's prefixes where they are
    gone = bal.by_id[during[-1]]
    bal.configure(Plan.model_validate({**TEST_PLAN, "affinity": {}}), [s for s in SPECS if s.id != gone.id])
    after = _homes(bal, prompts)
    for d, a in zip(during, after, strict=True):
        assert a == d or d == gone.id


def test_a_peer_down_mark_and_a_failed_health_check_forget_the_replica_too() -> None:
    bal = _balancer({})
    keys = _keys("shared system prompt " * 40)
    home = bal.pick("small", (), keys)
    assert home is not None
    bal.mark_down(home.id, 60.0)
    moved = bal.pick("small", (), keys)
    assert moved is not None and moved is not home
    home.open_until = 0.0
    assert bal.pick("small", (), keys) is moved  # the prefix stays where it moved

    class Refusing:
        async def get_status(self, url: str, path: str, timeout: float) -> int:
            return 503 if url == moved.url else 200

    asyncio.run(bal.check_all(Refusing()))
    again = bal.pick("small", (), keys)
    assert again is not None and again is not moved


def test_the_gateway_override_turns_affinity_on_with_the_plans_figures_or_the_defaults() -> None:
    assert _balancer(None, override=True).affinity == Affinity()
    on = _balancer({"enabled": False, "min_match": 0.9}, override=True).affinity
    assert on is not None and on.min_match == 0.9
    assert _balancer({"min_match": 0.9}).affinity is not None  # the plan's section alone turns it on


# ---- over HTTP --------------------------------------------------------------------------------------------------

#: one tier of four identical replicas; the plan keeps affinity off (the gateways under test turn it on), with
#: the thresholds the failover test loads to
AFFINITY_PLAN: dict[str, Any] = {
    "scenario": "builtin:paper-gsm8k",
    "routing": {"tiers": ["small"], "fractions": [1.0]},
    "deployment": [{"tier": "small", "model": "llama-3.1-8b", "gpu": "h100-sxm", "count": 4}],
    "affinity": {"enabled": False, "balance_abs": 3},
}
SYSTEM = [f"You are assistant {i}. " + f"Rule {i}: answer briefly and cite the manual. " * 30 for i in range(64)]


def _chat(system: str, question: str) -> dict[str, Any]:
    return {
        "model": "boute",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
    }


def _rendezvous_home(system: str, names: list[str]) -> str:
    """The replica a new system prompt goes to on an idle tier of equal replicas, computed here as any gateway
    computes it (its first block's rendezvous winner)."""
    settings = Affinity()
    text = render_messages([("system", system)], settings.block_chars)
    return names[rendezvous(prompt_keys(text, settings).keys[0], names, [0] * len(names), [1.0] * len(names), 1.5)]


def _two_per_replica(names: list[str]) -> dict[str, str]:
    """Two system prompts per replica by rendezvous (prompt -> home), the first replica's two with different
    homes among the others: a closed loop with one client per prompt then never exceeds the failover test's
    imbalance thresholds, before the first replica is killed or after (at most three clients on a survivor, so
    no two loads differ by more than ``balance_abs`` = 3), and where each prompt goes is exact."""
    chosen: dict[str, str] = {}
    next_homes: set[str] = set()
    for system in SYSTEM:
        home = _rendezvous_home(system, names)
        if sum(h == home for h in chosen.values()) == 2:
            continue
        if home == names[0]:
            next_home = _rendezvous_home(system, names[1:])
            if next_home in next_homes:
                continue
            next_homes.add(next_home)
        chosen[system] = home
    assert len(chosen) == 2 * len(names)
    return chosen


@pytest.fixture()
def replicas() -> Any:
    """AFFINITY_PLAN's four replicas, one process each (so one can be killed), for one test."""
    st = Stack.start(plan=AFFINITY_PLAN, speedup=50)
    try:
        yield st
    finally:
        st.stop()


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = re.escape(name) + (r"\{" + re.escape(want) + r"\}" if want else "") + r" ([0-9.e+]+)"
    m = re.search(pattern, text)
    return float(m.group(1)) if m else 0.0


@pytest.mark.timeout(120)
def test_shared_system_prompts_stay_on_one_replica_with_affinity_and_spread_without(replicas: Stack) -> None:
    on, _ = replicas.gateway(BOUTE_AFFINITY="true")
    off, _ = replicas.gateway()
    homes: dict[str, dict[int, set[str]]] = {on: defaultdict(set), off: defaultdict(set)}
    with httpx.Client(timeout=SAFETY_S) as c:
        for n in range(12):
            for p in range(3):  # three prompts over four replicas: least load's rotation never lines up with them
                for url in (on, off):
                    r = c.post(url + "/v1/chat/completions", json=_chat(SYSTEM[p], f"question {n} about {p}?"))
                    assert r.status_code == 200, r.text
                    homes[url][p].add(r.headers["x-boute-replica"])
        metrics = c.get(on + "/metrics").text
    assert all(len(homes[on][p]) == 1 for p in range(3)), homes[on]  # one replica per system prompt
    assert all(len(homes[off][p]) == 4 for p in range(3)), homes[off]  # least load: round the idle replicas
    assert _metric(metrics, "boute_affinity_routed_total", reason=NEW_PREFIX, tier="small") == 3
    assert _metric(metrics, "boute_affinity_routed_total", reason=AFFINITY, tier="small") == 33
    matched = _metric(metrics, "boute_affinity_matched_chars_total", tier="small")
    assert matched > 0.8 * _metric(metrics, "boute_affinity_prompt_chars_total", tier="small") * 33 / 36
    # usage per replica: prompt tokens as reported; cached tokens 0 where the backend reports none
    prompt = re.findall(r'boute_prompt_tokens_total\{replica="[^"]+",tier="small"\} ([0-9.]+)', metrics)
    cached = re.findall(r'boute_cached_tokens_total\{replica="[^"]+",tier="small"\} ([0-9.]+)', metrics)
    assert len(prompt) == len(cached) == len({next(iter(h)) for h in homes[on].values()})
    assert all(float(v) > 0 for v in prompt) and all(float(v) >= 0 for v in cached)


class _Load(ClosedLoop):
    """Closed-loop clients, one system prompt each, recording (prompt, replica, status) of every answer."""

    def __init__(self, url: str, prompts: list[str]) -> None:
        super().__init__(url, len(prompts))
        self.prompts = prompts
        self.answers: list[tuple[int, str, int]] = []

    async def one(self, client: httpx.AsyncClient, worker: int, n: int) -> None:
        try:
            r = await client.post(self.url + "/v1/chat/completions", json=_chat(self.prompts[worker], f"turn {n}?"))
            self.answers.append((worker, r.headers.get("x-boute-replica", ""), r.status_code))
        except httpx.HTTPError:
            self.answers.append((worker, "", -1))

    async def more(self, n: int, what: str) -> int:
        """Wait for ``n`` further answers; returns where they start in ``answers``."""
        start = len(self.answers)
        await self.reach(lambda: len(self.answers), start + n, what)
        return start


@pytest.mark.timeout(120)
async def test_a_killed_replica_fails_no_request_and_only_its_prompts_move(replicas: Stack) -> None:
    """Two prompts per replica; after one replica is killed mid-load no request fails, its two prompts find
    one new home each among the others (chosen so: two on one survivor would let the imbalance rule move others), every other prompt stays where it was, and no survivor takes it all."""
    assert replicas.backends_file is not None
    names = [b["name"] for b in json.loads(replicas.backends_file.read_text())]
    homes = _two_per_replica(names)
    prompts = list(homes)
    url, _ = replicas.gateway(BOUTE_AFFINITY="true")
    async with httpx.AsyncClient(timeout=SAFETY_S) as c:  # one by one on the idle tier: each at its home,
        for system, home in homes.items():  # as this process computed it without asking the gateway
            r = await c.post(url + "/v1/chat/completions", json=_chat(system, "hello?"))
            assert r.headers["x-boute-replica"] == home
    async with _Load(url, prompts) as load:
        start = await load.more(80, "answers from the four replicas")
        before = _modal(load.answers[start:])
        assert before == dict(enumerate(homes.values()))
        victim, index = names[0], 0  # the stack's replica processes are its registry's, in order
        await asyncio.to_thread(replicas.kill_replica, index)
        await load.more(40, "answers right after the kill")
        start = await load.more(120, "answers from the three replicas left")
        after_answers = load.answers[start:]
    assert {s for _, _, s in load.answers} == {200}, Counter(s for _, _, s in load.answers)  # none failed
    assert victim not in {rep for _, rep, _ in after_answers}
    after = _modal(after_answers)
    moved = {p for p in before if after[p] != before[p]}
    assert moved == {p for p, rep in before.items() if rep == victim}, (before, after)  # only the victim's
    # a prompt that stayed keeps its one home; a moved one went to the rendezvous choice among the survivors,
    # or, where the bounded load said so at an instant of the failover (retries of the victim's requests in
    # flight), to the next one in its order too: then both hold it and the tie goes to the less loaded
    homes_after = _replicas_of(after_answers)
    assert all(len(homes_after[p]) == 1 for p in before if p not in moved), homes_after
    assert all(1 <= len(homes_after[p]) <= 2 for p in moved), homes_after
    served = Counter(rep for _, rep, _ in after_answers)
    mean = sum(served.values()) / 3
    assert len(served) == 3 and max(served.values()) <= 2.0 * mean, served  # no survivor takes it all


def _replicas_of(answers: list[tuple[int, str, int]]) -> dict[int, Counter[str]]:
    """Per prompt, the replicas that answered it, counted."""
    seen: dict[int, Counter[str]] = defaultdict(Counter)
    for p, rep, _ in answers:
        seen[p][rep] += 1
    return seen


def _modal(answers: list[tuple[int, str, int]]) -> dict[int, str]:
    """Each prompt's most frequent replica."""
    return {p: c.most_common(1)[0][0] for p, c in _replicas_of(answers).items()}
