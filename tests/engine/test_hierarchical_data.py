import numpy as np
import pytest

from engine.data._domain import Attribute, Domain
from engine.data._hierarchical_data import HierarchicalData


def small_domain(M=3):
    np_attr = Attribute("NP", tuple(str(i) for i in range(1, M + 1)), tuple(str(i) for i in range(1, M + 1)))
    return Domain(
        group=(np_attr, Attribute("TEN", ("1", "2"), ("own", "rent"))),
        person=(Attribute("SEX", ("1", "2"), ("Male", "Female")), Attribute("AGE", ("0-17", "18+"), ("0-17", "18+"))),
        geography=("ST", "PUMA"),
        max_size=M,
    )


def random_data(rng, n=50, M=3):
    d = small_domain(M)
    sizes = rng.integers(1, M + 1, n)
    group = np.stack([sizes - 1, rng.integers(0, 2, n)], axis=1)
    person = rng.integers(0, 2, (sizes.sum(), 2))
    geo = np.stack([np.full(n, 10), rng.choice([100, 200, 300], n)], axis=1)
    return HierarchicalData.from_arrays(d, geo, group, person, np.r_[0, np.cumsum(sizes)])


def test_npz_round_trip(tmp_path):
    data = random_data(np.random.default_rng(1))
    data.to_npz(tmp_path / "d.npz")
    back = HierarchicalData.from_npz(tmp_path / "d.npz")
    assert back.equals(data)
    assert back.domain == data.domain


def test_take_keeps_persons_with_their_households():
    rng = np.random.default_rng(2)
    data = random_data(rng)
    idx = np.array([3, 3, 0, 7])
    sub = data.take(idx)
    for k, h in enumerate(idx):
        a, b = data.person_offsets[h], data.person_offsets[h + 1]
        c, d = sub.person_offsets[k], sub.person_offsets[k + 1]
        assert np.array_equal(sub.person[c:d], data.person[a:b])
        assert np.array_equal(sub.group[k], data.group[h])


def test_concat_and_select_are_inverse():
    data = random_data(np.random.default_rng(3))
    mask = data.geo[:, 1] == 100
    parts = [data.select(mask), data.select(~mask)]
    joined = HierarchicalData.concat(parts)
    order = np.r_[np.flatnonzero(mask), np.flatnonzero(~mask)]
    assert joined.equals(data.take(order))


def test_person_household_and_slot():
    data = random_data(np.random.default_rng(4))
    hh, slot = data.person_household, data.person_slot
    assert np.array_equal(np.bincount(hh, minlength=data.n_households), data.sizes)
    assert np.all(slot[data.person_offsets[:-1]] == 0)


def test_project_keeps_size_attribute():
    data = random_data(np.random.default_rng(5))
    p = data.project([], ["AGE"])
    assert [a.name for a in p.domain.group] == ["NP"]
    assert [a.name for a in p.domain.person] == ["AGE"]
    assert np.array_equal(p.person[:, 0], data.person[:, 1])


@pytest.mark.parametrize(
    "mutate, msg",
    [
        (lambda g, p, o: (g, p, np.r_[o[:-1], o[-1] - 1]), "person_offsets"),
        (lambda g, p, o: (np.c_[g[:, 0], g[:, 1] + 5], p, o), "TEN"),
        (lambda g, p, o: (np.c_[(g[:, 0] + 1) % 3, g[:, 1]], p, o), "NP must equal"),
        (lambda g, p, o: (g, p + 2, o), "SEX"),
    ],
)
def test_constructor_rejects_inconsistent_arrays(mutate, msg):
    data = random_data(np.random.default_rng(6))
    g, p, o = mutate(data.group.astype(int), data.person.astype(int), data.person_offsets)
    with pytest.raises(ValueError, match=msg):
        HierarchicalData.from_arrays(data.domain, data.geo[: len(o) - 1], g, p, o)


def test_domain_round_trip_and_checks():
    d = small_domain()
    assert Domain.from_dict(d.to_dict()) == d
    with pytest.raises(ValueError, match="NP codes"):
        Domain(d.group, d.person, d.geography, max_size=4)
