"""Picking a replica: prefix affinity with bounded load, least load, round robin, and the prompt
start that keys affinity."""

from collections import Counter

import pytest

from kvpilot_gateway.balance import Balancer, Choice, prefix_key

THREE = ["10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"]
IDLE: dict[str, float] = {}


def keys(n: int) -> list[bytes]:
    return [f"system: you are agent {i}. user: hello".encode() for i in range(n)]


# -- prefix_key --------------------------------------------------------------------------------


def test_chat_key_is_roles_and_contents_in_order():
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "!"}],
            },
        ],
    }
    key = prefix_key(body, 1024)
    assert key == b"system\x1fBe brief.\x1euser\x1fHi!\x1e"
    # Another turn appended keeps the start: the same key once chars cut it there.
    longer = {**body, "messages": [*body["messages"], {"role": "assistant", "content": None}]}
    assert prefix_key(longer, 12) == prefix_key(body, 12) == b"system\x1fBe br"
    # Non-text parts and a None content add nothing but the role.
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
    assert prefix_key({"messages": [image]}, 100) == b"user\x1f\x1e"


def test_chat_keys_differ_by_role():
    a = prefix_key({"messages": [{"role": "user", "content": "hello"}]}, 100)
    b = prefix_key({"messages": [{"role": "system", "content": "hello"}]}, 100)
    assert a != b


def test_completions_key():
    assert prefix_key({"prompt": "Once upon a time"}, 4) == b"Once"
    assert prefix_key({"prompt": ["first prompt", "second"]}, 100) == b"first prompt"
    assert prefix_key({"prompt": [101, 7, 42]}, 100) == b"101 7 42"
    assert prefix_key({"prompt": [[101, 7, 42], [5]]}, 5) == b"101 7"


def test_key_counts_characters_not_bytes():
    key = prefix_key({"prompt": "héllo wörld"}, 5)
    assert key == "héllo".encode()
    assert len(key) == 6


@pytest.mark.parametrize(
    "body",
    [{}, {"prompt": ""}, {"prompt": []}, {"messages": []}, {"prompt": None}, {"prompt": [""]}],
)
def test_empty_prompt_has_no_key(body):
    assert prefix_key(body, 1024) is None


def test_zero_chars_has_no_key():
    assert prefix_key({"prompt": "abc"}, 0) is None


# -- prefix-load -------------------------------------------------------------------------------


def test_same_key_sticks_to_one_replica():
    balancer = Balancer("prefix-load")
    key = b"system: a long shared system prompt"
    choices = {balancer.pick(THREE, IDLE, key) for _ in range(20)}
    assert len(choices) == 1
    assert next(iter(choices)).reason == "affinity"
    # Another balancer (another gateway replica, or this one restarted) agrees.
    assert Balancer("prefix-load").pick(THREE, IDLE, key) in choices
    # The order the endpoints come in does not matter.
    assert Balancer("prefix-load").pick(THREE[::-1], IDLE, key) in choices


def test_many_keys_spread_evenly():
    balancer = Balancer("prefix-load")
    counts = Counter(balancer.pick(THREE, IDLE, k).endpoint for k in keys(3000))
    assert set(counts) == set(THREE)
    for endpoint in THREE:
        assert 700 <= counts[endpoint] <= 1300, counts  # 1000 each ideally


def test_overloaded_replica_loses_its_keys_and_others_keep_theirs():
    balancer = Balancer("prefix-load", load_factor=1.25)
    owner = {k: balancer.pick(THREE, IDLE, k).endpoint for k in keys(300)}
    hot = THREE[0]
    load = {hot: 30.0, THREE[1]: 3.0, THREE[2]: 3.0}
    # Mean with this request (36 + 1) / 3, times 1.25: bound 16; the hot replica is over it.
    assert balancer.bound(THREE, load) == 16
    for key, endpoint in owner.items():
        choice = balancer.pick(THREE, load, key)
        if endpoint == hot:
            assert choice.reason == "overflow"
            assert choice.endpoint != hot
        else:
            assert choice == Choice(endpoint, "affinity")


def test_overflow_goes_to_the_same_next_replica_each_time():
    balancer = Balancer("prefix-load")
    key = keys(1)[0]
    hot = balancer.pick(THREE, IDLE, key).endpoint
    load = {hot: 50.0}
    spill = {balancer.pick(THREE, load, key) for _ in range(10)}
    assert len(spill) == 1
    assert next(iter(spill)).reason == "overflow"


def test_replica_at_the_bound_keeps_taking_until_over():
    balancer = Balancer("prefix-load", load_factor=1.25)
    key = keys(1)[0]
    home = balancer.pick(THREE, IDLE, key).endpoint
    others = [e for e in THREE if e != home]
    # Others at 4 each, home at h: the bound is ceil(1.25 * (8 + h + 1) / 3), so home takes the
    # request while h + 1 fits under it (up to h = 6, bound 7) and not from h = 7 (bound 7).
    taken = []
    for h in range(12):
        load = {home: float(h), others[0]: 4.0, others[1]: 4.0}
        choice = balancer.pick(THREE, load, key)
        assert (choice.endpoint == home) == (h + 1 <= balancer.bound(THREE, load))
        taken.append(choice.endpoint == home)
    assert taken == [True] * 7 + [False] * 5


def test_adding_a_replica_moves_about_a_quarter_of_keys():
    balancer = Balancer("prefix-load")
    sample = keys(4000)
    before = {k: balancer.pick(THREE, IDLE, k).endpoint for k in sample}
    four = [*THREE, "10.0.0.4:8000"]
    after = {k: balancer.pick(four, IDLE, k).endpoint for k in sample}
    moved = [k for k in sample if before[k] != after[k]]
    # Ideally 1/4; and every key that moved went to the new replica.
    assert 0.15 * len(sample) <= len(moved) <= 0.35 * len(sample)
    assert all(after[k] == "10.0.0.4:8000" for k in moved)


def test_removing_a_replica_moves_only_its_keys():
    balancer = Balancer("prefix-load")
    sample = keys(3000)
    before = {k: balancer.pick(THREE, IDLE, k).endpoint for k in sample}
    two = THREE[:2]
    after = {k: balancer.pick(two, IDLE, k).endpoint for k in sample}
    for k in sample:
        if before[k] in two:
            assert after[k] == before[k]


def test_no_key_falls_back_to_least_load():
    balancer = Balancer("prefix-load")
    load = {THREE[0]: 2.0, THREE[1]: 0.0, THREE[2]: 1.0}
    assert balancer.pick(THREE, load, None) == Choice(THREE[1], "least-load")


def test_fractional_loads_with_none_under_the_bound_take_the_least_loaded():
    balancer = Balancer("prefix-load", load_factor=1.0)
    load = {THREE[0]: 0.9, THREE[1]: 0.5, THREE[2]: 0.7}  # bound ceil(3.1 / 3) = 2: all fit
    assert balancer.pick(THREE, load, b"k").reason in ("affinity", "overflow")
    two = THREE[:2]
    load = {two[0]: 0.5, two[1]: 0.5}  # bound ceil(2 / 2) = 1, and 1.5 > 1 for both
    assert balancer.pick(two, load, b"k").reason == "least-load"


# -- least-load and round-robin ----------------------------------------------------------------


def test_least_load_takes_the_minimum():
    balancer = Balancer("least-load")
    load = {THREE[0]: 5.0, THREE[1]: 1.0, THREE[2]: 3.0}
    assert {balancer.pick(THREE, load, b"ignored") for _ in range(5)} == {
        Choice(THREE[1], "least-load")
    }


def test_least_load_ties_rotate():
    balancer = Balancer("least-load")
    load = {THREE[0]: 1.0, THREE[1]: 1.0, THREE[2]: 4.0}
    picks = [balancer.pick(THREE, load, None).endpoint for _ in range(6)]
    assert picks == [THREE[0], THREE[1]] * 3
    picks = [balancer.pick(THREE, IDLE, None).endpoint for _ in range(6)]
    assert Counter(picks) == Counter({e: 2 for e in THREE})


def test_round_robin_in_turn_over_sorted_endpoints():
    balancer = Balancer("round-robin")
    heavy = {THREE[0]: 100.0}  # load does not matter
    picks = [balancer.pick(THREE[::-1], heavy, b"k") for _ in range(6)]
    assert [c.endpoint for c in picks] == THREE * 2
    assert {c.reason for c in picks} == {"round-robin"}


def test_turns_are_kept_per_endpoint_set():
    # Two models, two replicas each, requests alternating: each model still alternates.
    balancer = Balancer("round-robin")
    a, b = ["a:1", "a:2"], ["b:1", "b:2"]
    picks = [balancer.pick(s, IDLE, None).endpoint for _ in range(2) for s in (a, b)]
    assert picks == ["a:1", "b:1", "a:2", "b:2"]


def test_no_endpoints_is_an_error():
    with pytest.raises(ValueError, match="no endpoints"):
        Balancer("prefix-load").pick([], IDLE, b"k")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("random",), "routing policy"),
        (("prefix-load", 0.5), "load factor"),
        (("least-load", 1.25, 0), "vnodes"),
    ],
)
def test_bad_settings_are_errors(args, message):
    with pytest.raises(ValueError, match=message):
        Balancer(*args)
