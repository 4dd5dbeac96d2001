"""FL+HC's clustering of updates, against hand-worked dendrograms."""

from __future__ import annotations

import numpy as np
import pytest

from fedgsp_flwr.core.flhc import cluster_updates, nearest_cluster

# Four updates on a line at 0, 1, 10 and 12: single linkage merges {0, 1} at 1, {10, 12}
# at 2, and the two at 9; complete linkage the last at 12; Ward's at
# sqrt(2 * 2 * 2 / 4) * |11.0 - 0.5| = 14.849 (the increase in within-cluster variance).
LINE = np.array([[0.0, 0.0], [1.0, 0.0], [10.0, 0.0], [12.0, 0.0]])


@pytest.mark.parametrize("linkage, top", [("single", 9.0), ("complete", 12.0),
                                          ("average", 10.5), ("ward", 14.8492424)])
def test_the_merge_heights_are_the_linkages(linkage: str, top: float) -> None:
    found = cluster_updates(LINE, [1, 1, 1, 1], threshold=5.0, linkage=linkage)
    assert found.heights == pytest.approx([1.0, 2.0, top])
    assert found.labels.tolist() == [0, 0, 1, 1]
    assert cluster_updates(LINE, [1] * 4, threshold=top + 1e-6,
                           linkage=linkage).labels.tolist() == [0] * 4


@pytest.mark.parametrize("threshold, labels", [(0.5, [0, 1, 2, 3]), (1.0, [0, 0, 1, 2]),
                                               (2.0, [0, 0, 1, 1]), (9.0, [0, 0, 0, 0])])
def test_the_threshold_keeps_the_merges_up_to_it(threshold: float, labels: list[int]) -> None:
    assert cluster_updates(LINE, [1] * 4, threshold, linkage="single").labels.tolist() == labels


def test_labels_follow_the_first_member_and_centroids_are_weighted() -> None:
    order = [2, 0, 3, 1]
    found = cluster_updates(LINE[order], [3, 1, 1, 1], threshold=5.0, linkage="single")
    assert found.labels.tolist() == [0, 1, 0, 1]  # the first row's cluster is 0
    assert found.centroids.tolist() == [[(3 * 10 + 12) / 4, 0.0], [0.5, 0.0]]
    assert found.num_clusters == 2


def test_manhattan_and_cosine_distances() -> None:
    diagonal = np.array([[1.0, 1.0], [2.0, 2.0], [1.0, -1.0]])
    cosine = cluster_updates(diagonal, [1] * 3, threshold=0.5, metric="cosine",
                             linkage="average")
    assert cosine.labels.tolist() == [0, 0, 1]  # same direction, whatever the length
    assert cosine.heights == pytest.approx([0.0, 1.0])
    manhattan = cluster_updates(diagonal, [1] * 3, threshold=2.5, metric="manhattan",
                                linkage="single")
    assert manhattan.heights == pytest.approx([2.0, 2.0])
    assert manhattan.labels.tolist() == [0, 0, 0]


def test_one_update_is_one_cluster() -> None:
    found = cluster_updates(LINE[:1], [2.0], threshold=1.0)
    assert found.labels.tolist() == [0] and found.heights.size == 0
    assert found.centroids.tolist() == [[0.0, 0.0]]


@pytest.mark.parametrize("kwargs, match", [
    ({"metric": "cosine", "linkage": "ward"}, "ward' needs metric 'euclidean"),
    ({"metric": "chebyshev"}, "metric must be one of"),
    ({"linkage": "centroid"}, "linkage must be one of"),
    ({"threshold": 0.0}, "threshold must be > 0"),
    ({"weights": [1, 1, 1]}, "one positive weight per update"),
    ({"weights": [1, 0, 1, 1]}, "one positive weight per update"),
])
def test_bad_settings_are_refused(kwargs: dict, match: str) -> None:
    arguments = {"updates": LINE, "weights": [1] * 4, "threshold": 1.0, **kwargs}
    with pytest.raises(ValueError, match=match):
        cluster_updates(**arguments)


def test_bad_updates_are_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        cluster_updates(np.array([[0.0, np.nan], [1.0, 0.0]]), [1, 1], 1.0)
    with pytest.raises(ValueError, match="zero update"):
        cluster_updates(np.array([[0.0, 0.0], [1.0, 0.0]]), [1, 1], 1.0, metric="cosine",
                        linkage="average")


def test_the_nearest_cluster_of_a_later_update() -> None:
    centroids = np.array([[0.5, 0.0], [11.0, 0.0]])
    assert nearest_cluster(np.array([9.0, 3.0]), centroids) == 1
    assert nearest_cluster(np.array([5.75, 0.0]), centroids) == 0  # a tie: the first
    assert nearest_cluster(np.array([1.0, 0.1]), np.array([[1.0, 0.0], [20.0, 20.0]]),
                           "cosine") == 0
    with pytest.raises(ValueError, match="do not fit"):
        nearest_cluster(np.array([1.0, 2.0, 3.0]), centroids)
