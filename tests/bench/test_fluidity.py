import pytest

from tokwatch.bench.fluidity import fluidity_index


def test_every_token_on_time():
    assert fluidity_index(0.5, [0.1, 0.1, 0.1], 1.0, 0.1) == 1.0


def test_slack_is_carried_forward_then_reset_by_a_miss():
    # first token: 0.5 <= 1.0, slack 0.5; 0.5 <= 0.1 + 0.5, slack 0.1; 0.25 > 0.1 + 0.1, miss, slack 0;
    # 0.1 <= 0.1 met.
    assert fluidity_index(0.5, [0.5, 0.25, 0.1], 1.0, 0.1) == pytest.approx(3 / 4)


def test_late_first_token_and_no_slack():
    # 2.0 > 1.0 miss (slack 0); 0.05 met (slack 0.05); 0.2 > 0.15 miss.
    assert fluidity_index(2.0, [0.05, 0.2], 1.0, 0.1) == pytest.approx(1 / 3)


def test_multi_token_chunk_zeros_bank_slack():
    # First token exactly on its deadline (no slack). A 3-token chunk after 0.25 s: gap 0.25 then two
    # zeros. 0.25 > 0.1 misses; each zero is on time and banks 0.1 of slack, so a later 0.25 gap
    # (<= 0.1 + 0.2) is on time.
    assert fluidity_index(1.0, [0.25, 0.0, 0.0, 0.25], 1.0, 0.1) == pytest.approx(4 / 5)


def test_single_token():
    assert fluidity_index(0.3, [], 0.2, 0.1) == 0.0


def test_deadlines_must_be_positive():
    with pytest.raises(ValueError):
        fluidity_index(0.1, [], 0.0, 0.1)
