"""User-edge assignment: objective and wall time of every policy, and exactness.

    python benchmarks/edge_assignment.py [--users 1000] [--edges 10] [--r 1,2,3,5]

The paper's setting: F = 10 classes, every user holds one class (sizes 20 to 100
examples), every edge originally holds users of only 2 classes, and every user is in
range of r edges, its original one among them. For each r: original, random, heuristic
(Algorithm 1), greedy (+ local search to convergence), equal-size (CP-SAT, 10 s) and optimal
(CP-SAT, 10 s, hinted with greedy), with CP-SAT's proven lower bound, and the
reference the issue quotes: the MILP alone (no hint) with 2 workers for 30 s. Exactness:
``optimal`` against brute force on random instances with N <= 12, E <= 3. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from fedgsp_flwr.core.edge_assignment import (
    AssignmentProblem,
    AssignmentResult,
    assign,
    brute_force,
    paper_topology,
)

NUM_CLASSES = 10


def paper_counts(num_users: int, rng: np.random.Generator) -> np.ndarray:
    """(N, 10) counts: user u holds one class, u mod 10, with 20 to 100 examples."""
    counts = np.zeros((num_users, NUM_CLASSES), dtype=np.int64)
    counts[np.arange(num_users), np.arange(num_users) % NUM_CLASSES] = rng.integers(
        20, 101, num_users)
    return counts


def bench_r(num_users: int, num_edges: int, r: int, seed: int, time_limit: float,
            reference_time: float) -> dict:
    """Every policy on one generated instance."""
    rng = np.random.default_rng(seed)
    counts = paper_counts(num_users, rng)
    reach, original = paper_topology(counts, num_edges, r, rng)
    problem = AssignmentProblem(counts, reach)
    out: dict = {"r": r}
    greedy = None
    for policy in ("original", "random", "heuristic", "greedy", "equal-size", "optimal"):
        result = assign(problem, policy, np.random.default_rng(seed), original=original,
                        time_limit=time_limit,
                        hint=greedy.assignment if greedy is not None else None)
        if policy == "greedy":
            greedy = result
        out[policy] = summary(result)
    reference = assign(problem, "optimal", np.random.default_rng(seed), greedy_hint=False,
                       time_limit=reference_time, workers=2)
    out["cp-sat-reference"] = summary(reference)
    out["greedy_at_most_reference"] = out["greedy"]["objective"] <= reference.objective
    return out


def summary(result: AssignmentResult) -> dict:
    """The JSON fields of one policy's result."""
    return {"objective": result.objective, "seconds": result.seconds,
            "status": result.status, "bound": result.bound}


def exactness(instances: int, seed: int) -> dict:
    """``optimal`` vs brute force on random small instances."""
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(instances):
        n, e = int(rng.integers(4, 13)), int(rng.integers(2, 4))
        counts = rng.integers(0, 8, size=(n, 4))
        counts[counts.sum(axis=1) == 0, 0] = 1
        reach = rng.random((e, n)) < 0.5
        reach[rng.integers(e, size=n), np.arange(n)] = True
        problem = AssignmentProblem(counts, reach)
        best, _ = brute_force(problem)
        found = assign(problem, "optimal", rng, time_limit=30).objective
        worst = max(worst, abs(found - best))
    return {"instances": instances, "max_abs_difference": worst}


def main() -> None:
    """Run the benchmark and print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--edges", type=int, default=10)
    parser.add_argument("--r", default="1,2,3,5")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--reference-time", type=float, default=30.0)
    parser.add_argument("--exact-instances", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    results = [bench_r(args.users, args.edges, int(r), args.seed, args.time_limit,
                       args.reference_time) for r in args.r.split(",")]
    print(json.dumps({
        "benchmark": "edge_assignment", "users": args.users, "edges": args.edges,
        "classes": NUM_CLASSES, "results": results,
        "exactness": exactness(args.exact_instances, args.seed),
        "seconds": time.perf_counter() - started,
    }, indent=2))


if __name__ == "__main__":
    main()
