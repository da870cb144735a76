import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.count_of_counts import emd_batch
from engine.count_of_counts._forms import clip_histogram, emd, emd_runs, expand_runs, h_to_hc, h_to_runs, hc_to_h, hg_to_runs, runs_to_h


def test_paper_example():
    # groups of sizes 4, 2, 1, 1 -> H = (0, 2, 1, 0, 1), Hc = (0, 2, 3, 3, 4), Hg = (1, 1, 2, 4)
    H = np.array([0, 2, 1, 0, 1])
    assert h_to_hc(H).tolist() == [0, 2, 3, 3, 4]
    s, c = h_to_runs(H)
    assert expand_runs(s, c).tolist() == [1, 1, 2, 4]
    assert np.array_equal(runs_to_h(*hg_to_runs([1, 1, 2, 4]), 4), H)


def test_emd_paper_intro():
    # 100 groups of size 1 vs all of size 2 (distance 100) vs all of size 5 (400)
    K = 6
    H = np.zeros(K + 1, int)
    H[1] = 100
    H2 = np.zeros(K + 1, int)
    H2[2] = 100
    H5 = np.zeros(K + 1, int)
    H5[5] = 100
    assert emd(H, H2) == 100 and emd(H, H5) == 400


def test_clip():
    assert clip_histogram([1, 2, 3, 4], 2).tolist() == [1, 2, 7]
    assert clip_histogram([1, 2], 3).tolist() == [1, 2, 0, 0]
    assert clip_histogram(np.array([[1, 2, 3]]), 1).tolist() == [[1, 5]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=40), st.integers(0, 10**6))
def test_roundtrips_and_emd(sizes, seed):
    rng = np.random.default_rng(seed)
    K = 7
    sizes = np.minimum(np.array(sizes), K)
    H = np.bincount(sizes, minlength=K + 1)
    assert np.array_equal(hc_to_h(h_to_hc(H)), H)
    s, c = h_to_runs(H)
    assert np.array_equal(expand_runs(s, c), np.sort(sizes))
    assert np.array_equal(runs_to_h(s, c, K), H)
    other = np.minimum(rng.integers(0, 10, sizes.size), K)
    H2 = np.bincount(other, minlength=K + 1)
    # EMD = persons to move = optimal matching of sorted sizes
    direct = int(np.abs(np.sort(sizes) - np.sort(other)).sum())
    assert emd(H, H2) == direct
    assert emd_runs(*h_to_runs(H), *h_to_runs(H2), K) == direct
    assert emd_batch(np.stack([H, H2]), np.stack([H2, H])).tolist() == [direct, direct]
