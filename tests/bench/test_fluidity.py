"""fluidity-index by hand: etalon's reference counting (default) and seed 004's text (`seed` mode).

Deadlines and gaps are binary fractions (0.5, 0.125, 0.0625 ...) so every sum and floor division below is
exact and the expected values are the ones worked out in the comments."""

import pytest

from tokwatch.bench.fluidity import deadline_counts, fluidity_index


def test_every_token_on_time():
    for mode in ("etalon", "seed"):
        assert fluidity_index(0.5, [0.125, 0.125, 0.125], 1.0, 0.125, mode) == 1.0
    assert deadline_counts(0.5, [0.125, 0.125, 0.125], 1.0, 0.125) == (4, 0)


def test_late_first_token_misses_one_deadline_per_decode_period():
    # D_p 0.5 s, D_d 62.5 ms, TTFT 1 s then 9 tokens exactly on their decode deadline.
    # etalon: the first token misses 1 + floor((1.0 - 0 - 0.5) / 0.0625) = 1 + 8 = 9 deadlines, the 9
    # later tokens meet theirs: 1 - 9 / (9 + 9) = 0.5.
    # seed text: one late token of 10: 9 / 10 = 0.9 — the same run reads as fluid there.
    ttft, tbt = 1.0, [0.0625] * 9
    assert deadline_counts(ttft, tbt, 0.5, 0.0625) == (9, 9)
    assert fluidity_index(ttft, tbt, 0.5, 0.0625) == 0.5
    assert fluidity_index(ttft, tbt, 0.5, 0.0625, "seed") == pytest.approx(0.9)


def test_first_token_late_by_less_than_a_decode_deadline_is_one_miss():
    # TTFT 0.53125 s against D_p 0.5 s: 1 + floor(0.03125 / 0.0625) = 1 missed deadline, nothing met.
    assert deadline_counts(0.53125, [], 0.5, 0.0625) == (0, 1)
    assert fluidity_index(0.53125, [], 0.5, 0.0625) == 0.0
    assert fluidity_index(0.53125, [], 0.5, 0.0625, "seed") == 0.0


def test_slack_is_carried_forward_then_reset_by_a_miss():
    # D_p 1 s, D_d 125 ms. TTFT 0.5 (met, slack 0.5); 0.5 <= 0.125 + 0.5 (met, slack 0.125);
    # 0.375 > 0.125 + 0.125 (late); 0.125 <= 0.125 + 0 (met).
    # etalon: the late token misses floor((0.375 - 0.125) / 0.125) = 2 deadlines: 1 - 2 / (3 + 2) = 0.6.
    # seed text: 3 of 4 tokens on time = 0.75.
    ttft, tbt = 0.5, [0.5, 0.375, 0.125]
    assert deadline_counts(ttft, tbt, 1.0, 0.125) == (3, 2)
    assert fluidity_index(ttft, tbt, 1.0, 0.125) == pytest.approx(0.6)
    assert fluidity_index(ttft, tbt, 1.0, 0.125, "seed") == pytest.approx(0.75)


def test_multi_token_chunk_zeros_bank_slack():
    # TTFT exactly on D_p (met, no slack). A 3-token chunk 0.25 s later: gap 0.25 then two zeros. 0.25 >
    # 0.125 is late; each zero is on time and banks 0.125 of slack, so the next 0.25 gap (<= 0.125 + 0.25)
    # is on time.
    # etalon: the late gap misses floor(0.25 / 0.125) = 2 deadlines; met 4: 1 - 2 / 6 = 2/3.
    # seed text: 4 of 5 tokens on time = 0.8.
    ttft, tbt = 1.0, [0.25, 0.0, 0.0, 0.25]
    assert deadline_counts(ttft, tbt, 1.0, 0.125) == (4, 2)
    assert fluidity_index(ttft, tbt, 1.0, 0.125) == pytest.approx(2 / 3)
    assert fluidity_index(ttft, tbt, 1.0, 0.125, "seed") == pytest.approx(0.8)


def test_floor_division_is_the_references_float_floor():
    # etalon computes (TTFT - slack - D_p) // D_d on floats: 1.0 // 0.05 is 19.0 (0.05 is stored as a
    # little more than 1/20), so a TTFT of 2 s against D_p 1 s, D_d 50 ms misses 1 + 19 = 20 deadlines.
    assert deadline_counts(2.0, [], 1.0, 0.05) == (0, 20)


def test_single_token_and_bad_deadlines():
    assert fluidity_index(0.125, [], 0.25, 0.125) == 1.0
    for mode in ("etalon", "seed"):
        with pytest.raises(ValueError):
            fluidity_index(0.1, [], 0.0, 0.1, mode)
