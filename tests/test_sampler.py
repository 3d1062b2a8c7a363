import math

import numpy as np
import pytest

from infer.engine.sampler import (
    InvalidSamplingParams,
    SamplingParams,
    apply_min_p,
    apply_penalties,
    apply_temperature,
    apply_top_k,
    apply_top_p,
    greedy,
    make_rng,
    make_sampler,
    sample_softmax,
)


def cands(values):
    logits = np.asarray(values, dtype=np.float32)
    return np.arange(logits.size, dtype=np.int64), logits


def kept(result):
    return sorted(int(i) for i in result[0])


def off(**kw):
    """Params with every filter off unless named."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    base.update(kw)
    return SamplingParams(**base)


# ---------------------------------------------------------------- top-k


def test_top_k_keeps_k_highest_sorted():
    ids, logits = cands([0.1, 3.0, -1.0, 2.0, 5.0, 0.0])
    out_ids, out_logits = apply_top_k(ids, logits, 3)
    assert out_ids.tolist() == [4, 1, 3]
    assert out_logits.tolist() == [5.0, 3.0, 2.0]


def test_top_k_off_and_larger_than_vocab():
    ids, logits = cands([1.0, 2.0, 3.0])
    assert apply_top_k(ids, logits, 0)[0] is ids
    assert apply_top_k(ids, logits, 10)[0].tolist() == [2, 1, 0]


def test_top_k_ties_go_to_lower_ids():
    ids, logits = cands([1.0, 2.0, 2.0, 2.0, 0.5, 2.0])
    assert apply_top_k(ids, logits, 2)[0].tolist() == [1, 2]
    assert apply_top_k(ids, logits, 5)[0].tolist() == [1, 2, 3, 5, 0]


def test_top_k_ties_use_ids_not_positions():
    ids = np.array([9, 7, 3, 5], dtype=np.int64)
    logits = np.array([1.0, 1.0, 1.0, 0.0], dtype=np.float32)
    assert apply_top_k(ids, logits, 2)[0].tolist() == [3, 7]


def test_top_k_matches_full_sort_on_large_vocab():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(262144).astype(np.float32)
    ids = np.arange(logits.size)
    out_ids, out_logits = apply_top_k(ids, logits, 40)
    assert out_ids.tolist() == np.argsort(-logits, kind="stable")[:40].tolist()
    assert np.all(np.diff(out_logits) <= 0)


def test_top_k_large_vocab_ties_at_boundary():
    logits = np.zeros(262144, dtype=np.float32)
    logits[[70000, 5, 200000]] = 1.0
    out_ids, _ = apply_top_k(np.arange(logits.size), logits, 6)
    assert out_ids.tolist() == [5, 70000, 200000, 0, 1, 2]


def test_top_k_large_vocab_mostly_neg_inf():
    logits = np.full(262144, -np.inf, dtype=np.float32)
    logits[[9, 100000]] = [0.5, 2.0]
    out_ids, _ = apply_top_k(np.arange(logits.size), logits, 3)
    assert out_ids.tolist() == [100000, 9, 0]


def test_top_k_with_neg_inf():
    ids, logits = cands([-np.inf, 1.0, -np.inf, -np.inf])
    assert apply_top_k(ids, logits, 2)[0].tolist() == [1, 0]


# ---------------------------------------------------------------- top-p


def test_top_p_cumulative_exactly_p_stops_there():
    # Four equal logits: probabilities are exactly 0.25 each, cumulative 0.25/0.5/0.75/1.
    ids, logits = cands([0.0, 0.0, 0.0, 0.0])
    assert apply_top_p(ids, logits, 0.5)[0].tolist() == [0, 1]
    assert apply_top_p(ids, logits, 0.75)[0].tolist() == [0, 1, 2]
    assert apply_top_p(ids, logits, 0.5000001)[0].tolist() == [0, 1, 2]
    assert apply_top_p(ids, logits, 0.25)[0].tolist() == [0]


def test_top_p_keeps_at_least_one():
    ids, logits = cands([10.0, 0.0, -1.0])
    assert apply_top_p(ids, logits, 0.01)[0].tolist() == [0]


def test_top_p_handcrafted():
    probs = np.array([0.1, 0.5, 0.05, 0.3, 0.05])
    ids, logits = cands(np.log(probs))
    # Sorted: 0.5 (1), 0.3 (3), 0.1 (0), 0.05, 0.05
    assert apply_top_p(ids, logits, 0.4)[0].tolist() == [1]
    assert apply_top_p(ids, logits, 0.7)[0].tolist() == [1, 3]
    assert apply_top_p(ids, logits, 0.85)[0].tolist() == [1, 3, 0]
    assert kept(apply_top_p(ids, logits, 0.95)) == [0, 1, 2, 3]


def test_top_p_off_is_identity():
    ids, logits = cands([3.0, 1.0, 2.0])
    out = apply_top_p(ids, logits, 1.0)
    assert out[0] is ids and out[1] is logits


def test_top_p_on_top_k_output_uses_renormalized_probs():
    # After top_k=2 the two survivors have 0.5 each, so p=0.5 keeps one.
    ids, logits = cands([1.0, 1.0, 0.9, 0.9, 0.9])
    ids, logits = apply_top_k(ids, logits, 2)
    assert apply_top_p(ids, logits, 0.5)[0].tolist() == [0]
    assert apply_top_p(ids, logits, 0.51)[0].tolist() == [0, 1]


def test_top_p_large_vocab_matches_reference():
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal(262144) * 4).astype(np.float32)
    ids = np.arange(logits.size)
    for p in (0.5, 0.9, 0.999):
        out_ids, _ = apply_top_p(ids, logits, p)
        order = np.argsort(-logits, kind="stable")
        probs = np.exp(logits.astype(np.float64) - logits.max())
        probs /= probs.sum()
        cum = np.cumsum(probs[order])
        n = int(np.flatnonzero(cum >= p)[0]) + 1
        assert out_ids.tolist() == order[:n].tolist()


# ---------------------------------------------------------------- min-p


def test_min_p_keeps_relative_to_max():
    probs = np.array([0.4, 0.3, 0.19, 0.1, 0.01])
    ids, logits = cands(np.log(probs))
    assert kept(apply_min_p(ids, logits, 0.5)) == [0, 1]  # threshold 0.2
    assert kept(apply_min_p(ids, logits, 0.2)) == [0, 1, 2, 3]  # threshold 0.08
    assert kept(apply_min_p(ids, logits, 0.01)) == [0, 1, 2, 3, 4]
    assert kept(apply_min_p(ids, logits, 1.0)) == [0]


def test_min_p_keeps_ties_with_max_and_equal_boundary():
    ids, logits = cands([2.0, 2.0, 1.0, 2.0])
    assert kept(apply_min_p(ids, logits, 1.0)) == [0, 1, 3]
    # prob ratio exactly 1 at the boundary counts as kept (>=)
    ids, logits = cands([0.0, 0.0, -50.0])
    assert kept(apply_min_p(ids, logits, 1.0)) == [0, 1]


def test_min_p_off():
    ids, logits = cands([1.0, -30.0])
    assert kept(apply_min_p(ids, logits, 0.0)) == [0, 1]


# ---------------------------------------------------------------- penalties


def test_repeat_penalty_divides_positive_multiplies_negative():
    ids, logits = cands([2.0, -2.0, 3.0, 4.0, 0.0])
    before = logits.copy()
    _, out = apply_penalties(ids, logits, np.array([0, 1, 1, 4]), repeat_penalty=2.0)
    np.testing.assert_allclose(out, [1.0, -4.0, 3.0, 4.0, 0.0])
    np.testing.assert_array_equal(logits, before)  # pure: input untouched


def test_repeat_penalty_window_is_last_n():
    ids, logits = cands([2.0, 2.0, 2.0])
    _, out = apply_penalties(ids, logits, np.array([0, 1, 2]), repeat_penalty=2.0, repeat_last_n=2)
    np.testing.assert_allclose(out, [2.0, 1.0, 1.0])
    _, out = apply_penalties(ids, logits, np.array([0, 1, 2]), repeat_penalty=2.0, repeat_last_n=-1)
    np.testing.assert_allclose(out, [1.0, 1.0, 1.0])
    _, out = apply_penalties(ids, logits, np.array([0, 1, 2]), repeat_penalty=2.0, repeat_last_n=0)
    np.testing.assert_allclose(out, [2.0, 2.0, 2.0])


def test_frequency_and_presence_penalties():
    ids, logits = cands([1.0, 1.0, 1.0, 1.0])
    history = np.array([2, 2, 2, 1, 3, 3], dtype=np.int32)
    _, out = apply_penalties(ids, logits, history, frequency_penalty=0.5, presence_penalty=0.25)
    np.testing.assert_allclose(out, [1.0, 1.0 - 0.5 - 0.25, 1.0 - 1.5 - 0.25, 1.0 - 1.0 - 0.25])


def test_all_penalties_combined_llama_cpp_order():
    # llama.cpp: repeat penalty first, then subtract count*freq + present.
    ids, logits = cands([4.0, -4.0])
    _, out = apply_penalties(
        ids, logits, np.array([0, 0, 1]), repeat_penalty=2.0, frequency_penalty=1.0, presence_penalty=0.5
    )
    np.testing.assert_allclose(out, [4.0 / 2 - 2.0 - 0.5, -4.0 * 2 - 1.0 - 0.5])


def test_penalties_ignore_out_of_range_history_and_empty_history():
    ids, logits = cands([1.0, 1.0])
    _, out = apply_penalties(ids, logits, np.array([-1, 7]), repeat_penalty=2.0)
    np.testing.assert_allclose(out, [1.0, 1.0])
    _, out = apply_penalties(ids, logits, np.array([], dtype=np.int64), repeat_penalty=2.0)
    np.testing.assert_allclose(out, [1.0, 1.0])


def test_penalties_on_subset_candidates():
    ids = np.array([10, 3, 7], dtype=np.int64)
    logits = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    _, out = apply_penalties(ids, logits, np.array([7, 7, 10]), frequency_penalty=1.0)
    np.testing.assert_allclose(out, [0.0, 1.0, -1.0])


def test_penalties_on_sorted_subset_with_gaps():
    ids = np.array([2, 5, 9], dtype=np.int64)
    logits = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    _, out = apply_penalties(ids, logits, np.array([5, 9, 9, 4, 100]), frequency_penalty=1.0)
    np.testing.assert_allclose(out, [1.0, 0.0, -1.0])


def test_penalties_change_greedy_choice():
    logits = np.array([5.0, 4.0, 1.0], dtype=np.float32)
    sample = make_sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0))
    assert sample(logits.copy(), np.array([], dtype=np.int64), None) == 0
    assert sample(logits.copy(), np.array([0]), None) == 1


# ---------------------------------------------------------------- temperature and drawing


def test_temperature_divides():
    ids, logits = cands([2.0, -1.0])
    np.testing.assert_allclose(apply_temperature(ids, logits, 0.5)[1], [4.0, -2.0])
    np.testing.assert_allclose(apply_temperature(ids, logits, 1.0)[1], [2.0, -1.0])


def test_temperature_zero_is_argmax_and_ignores_rng():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(1000).astype(np.float32)
    sample = make_sampler(SamplingParams(temperature=0.0))
    history = np.array([1, 2, 3])
    assert sample(logits.copy(), history, None) == int(np.argmax(logits))
    r = make_rng(5)
    state = r.bit_generator.state
    for _ in range(5):
        assert sample(logits.copy(), history, r) == int(np.argmax(logits))
    assert r.bit_generator.state == state


def test_greedy_first_of_ties():
    ids, logits = cands([1.0, 3.0, 3.0])
    assert greedy(ids, logits) == 1


def test_sample_softmax_never_picks_zero_probability():
    ids, logits = cands([-np.inf, 0.0, -np.inf, 0.0, -np.inf])
    rng = make_rng(3)
    picks = {sample_softmax(ids, logits, rng) for _ in range(500)}
    assert picks == {1, 3}


def test_seeded_sampling_is_reproducible():
    logits = np.random.default_rng(42).standard_normal(5000).astype(np.float32) * 2
    params = SamplingParams(seed=1234, temperature=1.0, top_k=100, top_p=0.95, min_p=0.0)
    sample = make_sampler(params)

    def run(seed):
        rng = make_rng(seed)
        history = []
        for _ in range(50):
            history.append(sample(logits.copy(), np.array(history, dtype=np.int64), rng))
        return history

    a, b, c = run(1234), run(1234), run(4321)
    assert a == b
    assert a != c


def test_unseeded_rngs_differ():
    assert make_rng(None).random() != make_rng(None).random()


def test_empirical_distribution_matches_softmax():
    logits = np.array([1.0, 0.0, -0.5, 2.0, 0.3, -2.0], dtype=np.float32)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    sample = make_sampler(off())
    rng = make_rng(2024)
    n = 30000
    counts = np.bincount(
        [sample(logits.copy(), np.array([], dtype=np.int64), rng) for _ in range(n)], minlength=logits.size
    )
    expected = probs * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    # 5 degrees of freedom: P(chi2 > 20.5) ~ 0.001
    assert chi2 < 20.5, (counts, expected)


def test_empirical_distribution_with_temperature():
    logits = np.array([1.0, 0.0, 2.0], dtype=np.float32)
    t = 0.5
    probs = np.exp((logits - logits.max()) / t)
    probs /= probs.sum()
    sample = make_sampler(off(temperature=t))
    rng = make_rng(7)
    n = 20000
    counts = np.bincount([sample(logits.copy(), np.array([0]), rng) for _ in range(n)], minlength=3)
    chi2 = float(((counts - probs * n) ** 2 / (probs * n)).sum())
    assert chi2 < 13.8  # 2 dof, p ~ 0.001


def test_full_chain_only_samples_from_survivors():
    logits = np.array([3.0, 2.9, 2.8, 0.0, -1.0, 2.7], dtype=np.float32)
    sample = make_sampler(SamplingParams(temperature=1.5, top_k=3, top_p=1.0, min_p=0.0))
    rng = make_rng(0)
    picks = {sample(logits.copy(), np.array([], dtype=np.int64), rng) for _ in range(300)}
    assert picks == {0, 1, 2}


def test_full_chain_min_p_after_top_p():
    # top_p=0.95 keeps all but the tail; min_p=0.3 then drops anything below 0.3 * max.
    probs = np.array([0.5, 0.2, 0.14, 0.1, 0.06])
    logits = np.log(probs).astype(np.float32)
    sample = make_sampler(SamplingParams(temperature=1.0, top_k=0, top_p=0.95, min_p=0.3))
    rng = make_rng(1)
    picks = {sample(logits.copy(), np.array([], dtype=np.int64), rng) for _ in range(500)}
    assert picks == {0, 1}


def test_large_vocab_default_chain_runs():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(262144).astype(np.float32) * 3
    sample = make_sampler(SamplingParams(repeat_penalty=1.1, frequency_penalty=0.1))
    history = rng.integers(0, 262144, size=200)
    r = make_rng(0)
    top40 = set(np.argsort(-logits)[:40].tolist())
    for _ in range(20):
        assert sample(logits.copy(), history, r) in top40 | set(history.tolist())


def test_sampler_needs_rng_when_sampling():
    sample = make_sampler(off())
    with pytest.raises(InvalidSamplingParams, match="rng"):
        sample(np.zeros(3, dtype=np.float32), np.array([], dtype=np.int64), None)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "kw, field",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature="hot"), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(min_p=-0.1), "min_p"),
        (dict(min_p=1.1), "min_p"),
        (dict(repeat_penalty=0.0), "repeat_penalty"),
        (dict(repeat_penalty=-1.0), "repeat_penalty"),
        (dict(repeat_last_n=-2), "repeat_last_n"),
        (dict(frequency_penalty=float("inf")), "frequency_penalty"),
        (dict(frequency_penalty=-1e300), "frequency_penalty"),  # infinite as a 32-bit float
        (dict(temperature=10**400), "temperature"),  # past float64 too
        (dict(presence_penalty=None), "presence_penalty"),
        (dict(seed=-1), "seed"),
        (dict(seed=1.5), "seed"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=True), "max_tokens"),
        (dict(stop="###"), "stop"),
        (dict(stop=("ok", "")), "stop"),
        (dict(stop=(1,)), "stop"),
    ],
)
def test_validation_errors_name_the_field(kw, field):
    with pytest.raises(InvalidSamplingParams, match=field) as exc:
        SamplingParams(**kw)
    assert isinstance(exc.value, ValueError)
    assert "\n" not in str(exc.value)


def test_extreme_temperature_and_penalties_sample_their_limit():
    """A temperature so small, or penalties so large, that float32 logits overflow: the softmax's
    limit (the highest logit), not a NaN draw, and no numpy warnings."""
    import warnings

    logits = np.array([1.0, 3.0, 2.0, -1.0], np.float32)
    rng = make_rng(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert make_sampler(SamplingParams(temperature=1e-40, top_k=0, top_p=1, min_p=0))(logits, [], rng) == 1
        boosted = SamplingParams(temperature=1.0, top_k=0, top_p=1, min_p=0, repeat_penalty=1e-38,
                                 frequency_penalty=3e38, presence_penalty=-3e38)
        for _ in range(20):  # token 2 in history: divided by ~0 it is +inf; frequency - presence is inf - inf
            assert make_sampler(boosted)(logits, np.array([2, 2]), rng) in (0, 1, 3)


def test_valid_params_and_stop_list_becomes_tuple():
    p = SamplingParams(temperature=0, top_k=0, top_p=1, min_p=0, seed=0, stop=["a", "b"])
    assert p.stop == ("a", "b")
    hash(p)
    with pytest.raises(AttributeError):
        p.temperature = 1.0  # type: ignore[misc]


def test_make_rng_validates_seed():
    with pytest.raises(InvalidSamplingParams, match="seed"):
        make_rng(-5)
    assert make_rng(3).random() == make_rng(3).random()
    assert math.isfinite(make_rng(None).random())
