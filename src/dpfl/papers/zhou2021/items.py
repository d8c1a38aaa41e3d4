"""Zhou, Liu, Fu, Wu, Li, Yu (2021), "Optimizing the numbers of queries and replies in federated learning with
differential privacy": Table I (the planned T* and b* under Laplace noise), the final loss against T for b in
{1, 5, 10} (Laplace, Figs. 2-3) and the Gaussian mechanism's preference for b = N (Sec. VI-B).
``dpfl.papers.zhou2021.experiment`` runs the experiments; docs/experiments/zhou2021.md discusses a 3-seed run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dpfl.reproduction.item import DIFFERS, REPRODUCED, Item, Row

PAPER = "Zhou, Liu, Fu, Wu, Li, Yu (2021)"
EPSILONS = (1.0, 5.0, 10.0)


def _table_settings(quick: bool) -> dict:
    from dpfl.papers.zhou2021.experiment import TABLE_I, TABLE_I_FITS

    return {"table": TABLE_I, "fits": TABLE_I_FITS, "epsilons": list(EPSILONS)}


def _table(settings: dict, folder: Path) -> dict:
    from dpfl.papers.zhou2021.experiment import table_constants
    from dpfl.planning.queries_replies import LaplaceBound, plan

    rows = []
    for dataset, (b5, b10, t50, joint) in settings["table"].items():
        gamma, U, V = settings["fits"][dataset]
        for k, eps in enumerate(settings["epsilons"]):
            c = table_constants(dataset, gamma, U, V, eps)
            bound = LaplaceBound(c)
            for label, b, printed in (("T* at b = 5", 5, b5[k]), ("T* at b = 10", 10, b10[k])):
                t = bound.rounds(b)
                integer = plan(c, "laplace", "rounds", clients_per_round=b).rounds
                note = "" if integer == printed else (f"T* = {t:.2f} rounds to {printed}; the planner's integer "
                                                      f"choice is {integer} (the smaller U of floor and ceil)")
                rows.append(Row(f"{dataset}, eps = {eps:g}: {label}", printed, f"{t:.2f}", None,
                                abs(t - printed) <= 0.5, note))
            up = plan(c, "laplace", "clients", rounds=50, rounding="up").clients_per_round
            rows.append(Row(f"{dataset}, eps = {eps:g}: b* at T = 50 (rounded up)", t50[k], up, None, up == t50[k]))
            t, b = bound.joint_kkt()
            rows.append(Row(f"{dataset}, eps = {eps:g}: joint (b*, T*)", f"(1, {joint[k]})", f"({b:g}, {t:.2f})",
                            None, b == 1.0 and abs(t - joint[k]) <= 0.5))
    return {"rows": rows}


def _setup(quick: bool):
    from dpfl.papers.zhou2021.experiment import Setup

    # full: MNIST with the paper's clips xi_1 = 300, xi_2 = 10 (pixels in [0, 1], the loader's public 1/255)
    return Setup() if quick else Setup(data="mnist", scale=1.0, clip_laplace=300.0, clip_gaussian=10.0)


def _loss_settings(quick: bool) -> dict:
    from dpfl.papers.zhou2021.experiment import PAPER_CLIENTS, PAPER_ROUNDS

    return {"setup": dataclasses.asdict(_setup(quick)), "repeats": 1 if quick else 10, "epsilons": list(EPSILONS),
            "rounds": list(PAPER_ROUNDS), "clients": list(PAPER_CLIENTS)}


def _run(settings: dict, folder: Path, laplace: bool) -> dict:
    from dpfl.papers.zhou2021 import experiment as zhou2021

    args = ["--out", str(folder / "runs"), "--repeats", str(settings["repeats"]),
            "--clients", ",".join(map(str, settings["clients"]))]
    if laplace:
        args += ["--epsilons", ",".join(map(str, settings["epsilons"])),
                 "--rounds", ",".join(map(str, settings["rounds"])), "--gaussian-epsilons", ""]
    else:
        args += ["--epsilons", "", "--gaussian-epsilons", ",".join(map(str, settings["epsilons"])),
                 "--gaussian-rounds", str(settings["rounds"])]
    for key, value in settings["setup"].items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return zhou2021.main(args)


def _loss(settings: dict, folder: Path) -> dict:
    from dpfl.papers.zhou2021 import experiment as zhou2021

    result = _run(settings, folder, laplace=True)
    summary = [r for r in result["summary"] if zhou2021.GRID in r["sources"].split(";")]
    (folder / "figure.png").write_bytes((folder / "runs" / "zhou2021.png").read_bytes())
    rows = []
    for eps in settings["epsilons"]:
        grid = {(r["clients_per_round"], r["rounds"]): r["train_loss"] for r in summary if r["epsilon"] == eps}
        rounds = sorted({t for _, t in grid})
        b1_best = sum(grid[(1, t)] <= min(grid[(b, t)] for b in settings["clients"]) for t in rounds)
        rows.append(Row(f"Laplace, eps = {eps:g}: b = 1 has the least final loss at each T of the grid", "holds",
                        f"at {b1_best} of {len(rounds)} T", None, b1_best == len(rounds)))
        best_t = min(rounds, key=lambda t: grid[(1, t)])
        rows.append(Row(f"Laplace, eps = {eps:g}: the final loss at b = 1 grows with T beyond a small T",
                        "holds", f"least at T = {best_t}, {grid[(1, best_t)]:.3f}; at T = {rounds[-1]}: "
                        f"{grid[(1, rounds[-1])]:.3f}", None, best_t < rounds[-1]))
        plans = result["plans"][f"laplace eps={eps:g}"]
        joint = plans[zhou2021.JOINT]
        planned = next(r for r in result["summary"] if r["epsilon"] == eps and r["mechanism"] == "laplace"
                       and (r["clients_per_round"], r["rounds"]) == (joint["clients_per_round"], joint["rounds"]))
        best = min(grid.values())
        rows.append(Row(f"Laplace, eps = {eps:g}: the joint plan's b*", 1, joint["clients_per_round"], None,
                        joint["clients_per_round"] == 1,
                        "" if joint["clients_per_round"] == 1 else "the constants of this data set give gamma = "
                        "2 lambda / mu = 300, where the bound favours b = N and a small T (docs/experiments/"
                        "zhou2021.md); the paper's MNIST constants give gamma ~ 2.7"))
        trains = joint["rounds"] > 0
        rows.append(Row(f"Laplace, eps = {eps:g}: the planned (b*, T*)'s final loss no worse than the grid's least",
                        "holds", f"({joint['clients_per_round']}, {joint['rounds']}): {planned['train_loss']:.3f} "
                        f"against {best:.3f}", None, planned["train_loss"] <= best + 1e-9 if trains else None,
                        "the paper's figures show its plans near the grid's best" if trains else
                        UNTRAINED))
    return {"rows": rows, "constants": result["constants"], "plans": result["plans"], "summary": result["summary"]}


#: A plan of T* = 0 queries, compared with the runs that train
UNTRAINED = ("T* = 0: the plan does not train (its loss is the initial model's), so its ending below every run of the "
             "grid says only that at this eps the noise outweighs what any run learns; nothing to match")


def _gaussian_settings(quick: bool) -> dict:
    from dpfl.papers.zhou2021.experiment import GAUSSIAN_EPSILONS, PAPER_CLIENTS

    return {"setup": dataclasses.asdict(_setup(quick)), "repeats": 1 if quick else 10,
            "epsilons": list(GAUSSIAN_EPSILONS), "rounds": 100, "clients": list(PAPER_CLIENTS)}


def _gaussian(settings: dict, folder: Path) -> dict:
    result = _run(settings, folder, laplace=False)
    rows = []
    for eps in settings["epsilons"]:
        loss = {r["clients_per_round"]: r["train_loss"] for r in result["summary"]
                if r["epsilon"] == eps and r["rounds"] == settings["rounds"]}
        losses = [loss[b] for b in settings["clients"]]
        falls = all(a > b for a, b in zip(losses, losses[1:]))
        rows.append(Row(f"Gaussian, eps = {eps:g}, T = {settings['rounds']}: the final loss falls with b (b = "
                        f"{', '.join(map(str, settings['clients']))})", "holds",
                        ", ".join(f"{v:.4g}" for v in losses), None, falls,
                        "" if falls else "the noise multiplier each client needs grows with its replies (b T / N) "
                        "under dpfl's proven bound for sampling without replacement"))
    return {"rows": rows, "plans": result["plans"], "summary": result["summary"]}



#: The paper's Fig. 1 regime on MNIST (full runs): weight decay w = 1 makes F mu = 1 strongly convex, so gamma = 2
#: lambda / mu ~ 5 (the constants fitted to Table I give 2.7 on MNIST, 4.8 on FEMNIST), where the planner's joint
#: optimum is b* = 1 with T* in the tens to hundreds; at w = 0.01 (zhou2021-loss) gamma = 300 and b* = N. On digits
#: w = 1 leaves F* = 2.21 against ln 10 = 2.30 (the uncentred pixels' mean image carries the curvature), so the quick
#: runs use ``zhou2021.B_STAR_ONE`` (breast cancer, w = 2), where b* = 1 comes with real learning.
REGIME_WEIGHT_DECAY = 1.0
#: The joint (b*, T*) of Table I on MNIST (b* = 1), eps = 1, 5, 10.
TABLE_I_JOINT = (22, 121, 244)


def _regime_setup(quick: bool):
    from dpfl.papers.zhou2021.experiment import B_STAR_ONE

    return B_STAR_ONE if quick else dataclasses.replace(_setup(quick), weight_decay=REGIME_WEIGHT_DECAY)


def _fig1_settings(quick: bool) -> dict:
    return {"setup": dataclasses.asdict(_regime_setup(quick)), "repeats": 1 if quick else 10,
            "epsilons": list(EPSILONS), "clients": [1, 5, 10],
            "rounds": [10, 100] if quick else [10, 50, 100, 250, 500], "evaluations": 50}


def _curves(settings: dict, estimates, points) -> list[dict]:
    """Each point's runs (``settings["repeats"]`` seeds), each evaluated about ``settings["evaluations"]`` times."""
    from dpfl.papers.zhou2021.experiment import Setup, run_point

    setup = Setup(**settings["setup"])
    return [run_point(setup, p, seed, estimates.lam, max(1, p.rounds // settings["evaluations"]))
            for p in points for seed in range(settings["repeats"])]


def _mean_curve(runs: list[dict]) -> list[list[float]]:
    """The seeds' mean training loss at each evaluated round (a diverged seed stops early: its rounds are left)."""
    rounds = min((r["curve"] for r in runs), key=len)
    return [[t, sum(r["curve"][k][1] for r in runs) / len(runs)] for k, (t, _) in enumerate(rounds)]


def _fig1(settings: dict, folder: Path) -> dict:
    from dpfl.papers.zhou2021.experiment import GRID, JOINT, Point, Setup, estimate, laplace_plans

    setup = Setup(**settings["setup"])
    est = estimate(setup)
    rows, curves, plans = [], {}, {}
    for k, eps in enumerate(settings["epsilons"]):
        named = laplace_plans(est, setup, eps, tuple(settings["clients"]))
        plans[f"{eps:g}"] = {name: p.to_dict() for name, p in named.items()}
        joint = named[JOINT]
        reasons: dict[tuple[int, int], list[str]] = {}
        for b in settings["clients"]:
            for T in settings["rounds"]:
                reasons.setdefault((b, T), []).append(GRID)
        for name, p in named.items():
            reasons.setdefault((p.clients_per_round, p.rounds), []).append(name)
        points = [Point("laplace", eps, b, T, tuple(why)) for (b, T), why in reasons.items()]
        runs = _curves(settings, est, points)
        final = {}
        for p in points:
            mine = [r for r in runs if (r["clients_per_round"], r["rounds"]) == (p.clients_per_round, p.rounds)]
            curves[f"{eps:g}: b = {p.clients_per_round}, T = {p.rounds}"] = {
                "sources": list(p.sources), "curve": _mean_curve(mine)}
            final[(p.clients_per_round, p.rounds)] = sum(r["train_loss"] for r in mine) / len(mine)
        b, T = joint.clients_per_round, joint.rounds
        regime = b == 1 and 10 <= T <= 1000
        rows.append(Row(f"eps = {eps:g}: the joint plan (b*, T*)", f"(1, {TABLE_I_JOINT[k]}) on MNIST", f"({b}, {T})",
                        None, regime, ("the paper's regime (b* = 1, T* in the tens to hundreds); T* is set by each "
                                       "data set's constants (Table I's are MNIST's, 60,000 records)") if regime else
                        "not the paper's regime"))
        b1_best = sum(final[(1, t)] <= min(final[(c, t)] for c in settings["clients"]) + 1e-9
                      for t in settings["rounds"])
        rows.append(Row(f"eps = {eps:g}: b = 1 has the least final loss at each T of "
                        f"{', '.join(map(str, settings['rounds']))}", "holds",
                        f"at {b1_best} of {len(settings['rounds'])} T", None, b1_best == len(settings["rounds"])))
        others = {bt: v for bt, v in final.items() if bt != (b, T)}
        rival = min(others, key=others.get)
        least = final[(b, T)] <= others[rival] + 1e-9
        rows.append(Row(f"eps = {eps:g}: the planned (b*, T*) ends with the least loss of the curves", "holds",
                        f"{final[(b, T)]:.3f} at ({b}, {T}); next best {others[rival]:.3f} at {rival}", None, least,
                        "" if least else "fewer queries do better than the planned T*: the bound's optimisation "
                        "term falls as gamma Y0 / (T + gamma) while the runs' noise-free error reaches the clipping "
                        "floor within about 50 queries (zhou2021-causes; round robin already makes the bound's "
                        "reply count the ledger's)"))
    _plot_fig1(curves, settings["epsilons"], folder / "figure.png")
    return {"rows": rows, "constants": est.to_dict(), "plans": plans, "curves": curves}


def _plot_fig1(curves: dict, epsilons: list[float], path: Path) -> None:
    """The paper's Fig. 1 (a): training loss per global iteration, one curve per (b, T), one panel per eps; the
    planned (b*, T*) in black."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dpfl.papers.zhou2021.experiment import JOINT

    fig, axes = plt.subplots(1, len(epsilons), figsize=(4.5 * len(epsilons), 3.8), squeeze=False)
    for ax, eps in zip(axes[0], epsilons):
        mine = {name.split(": ", 1)[1]: c for name, c in curves.items() if name.startswith(f"{eps:g}: ")}
        for k, (name, c) in enumerate(sorted(mine.items(), key=lambda kv: JOINT in kv[1]["sources"])):
            planned = JOINT in c["sources"]
            t, loss = zip(*c["curve"])
            ax.plot(t, loss, color="k" if planned else f"C{k % 10}", lw=2.2 if planned else 1.0,
                    label=(f"b* = {name[4:]}".replace(", T =", ", T* =") if planned else name))
        ax.set_xscale("symlog", linthresh=10)
        ax.set_yscale("log")
        ax.set_xlabel("global iteration")
        ax.set_title(f"Laplace mechanism, eps = {eps:g}")
        ax.legend(fontsize=6, ncol=2)
    axes[0][0].set_ylabel("loss function")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _size_settings(quick: bool) -> dict:
    return {"setup": dataclasses.asdict(_regime_setup(quick)), "repeats": 1 if quick else 10,
            "epsilons": [1.0, 10.0, 100.0] if quick else [float(e) for e in range(1, 11)],
            "portions": [0.1, 0.3, 0.6, 1.0] if quick else [k / 10 for k in range(1, 11)]}


def _size(settings: dict, folder: Path) -> dict:
    from dpfl.papers.zhou2021.experiment import (JOINT, Point, Setup, estimate, laplace_plans, run_point,
                                                  smallest_client)

    base = Setup(**settings["setup"])
    most = smallest_client(base)
    results = []
    for portion in settings["portions"]:
        setup = dataclasses.replace(base, samples_per_client=0 if portion == 1 else round(portion * most))
        est = estimate(setup)
        for eps in settings["epsilons"]:
            joint = laplace_plans(est, setup, eps, (1, setup.num_clients))[JOINT]
            point = Point("laplace", eps, joint.clients_per_round, joint.rounds, (JOINT,))
            runs = [run_point(setup, point, seed, est.lam) for seed in range(settings["repeats"])]
            results.append({"portion": portion, "records_per_client": setup.samples_per_client or most,
                            "epsilon": eps, "clients_per_round": joint.clients_per_round, "rounds": joint.rounds,
                            "test_accuracy": sum(r["test_accuracy"] for r in runs) / len(runs),
                            "train_loss": sum(r["train_loss"] for r in runs) / len(runs)})
    accuracy = {(r["portion"], r["epsilon"]): r["test_accuracy"] for r in results}
    rows = [Row(f"portion {r['portion']:g} ({r['records_per_client']} records a client), eps = {r['epsilon']:g}: "
                f"test accuracy at the planned (b*, T*) = ({r['clients_per_round']}, {r['rounds']})", None,
                f"{r['test_accuracy']:.3f}", None, None, "the paper plots these without printing values"
                + ("" if r["rounds"] else "; T* = 0: the plan does not train (the initial model's accuracy)"))
            for r in results]
    portions, epsilons = settings["portions"], settings["epsilons"]
    by_portion = sum(all(accuracy[(a, e)] <= accuracy[(b, e)] for a, b in zip(portions, portions[1:]))
                     for e in epsilons)
    by_eps = sum(all(accuracy[(p, a)] <= accuracy[(p, b)] for a, b in zip(epsilons, epsilons[1:])) for p in portions)
    rows.append(Row("Laplace: the accuracy grows with the portion of data used", "holds",
                    f"at {by_portion} of {len(epsilons)} eps", None, by_portion == len(epsilons)))
    rows.append(Row("Laplace: the accuracy grows with eps", "holds", f"at {by_eps} of {len(portions)} "
                    "portions", None, by_eps == len(portions)))
    _plot_size(results, epsilons, folder / "figure.png")
    return {"rows": rows, "results": results}


def _plot_size(results: list[dict], epsilons: list[float], path: Path) -> None:
    """The paper's Figs. 7-8 (a): test accuracy at the planned (b*, T*) against the portion of each client's data
    used, one line per eps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.8))
    for eps in epsilons:
        mine = [r for r in results if r["epsilon"] == eps]
        ax.plot([100 * r["portion"] for r in mine], [r["test_accuracy"] for r in mine], marker="o",
                label=f"eps = {eps:g}")
    ax.set_xlabel("portion of data samples used (%)")
    ax.set_ylabel("model accuracy")
    ax.set_title("Laplace mechanism, planned (b*, T*)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _causes_settings(quick: bool) -> dict:
    from dpfl.papers.zhou2021.experiment import B_STAR_ONE
    from dpfl.papers.zhou2021.causes import EPSILONS as CAUSES_EPSILONS, ROUNDS

    return {"setup": dataclasses.asdict(B_STAR_ONE), "repeats": 3 if quick else 10,
            "epsilons": list(CAUSES_EPSILONS), "rounds": list(ROUNDS)}


def _causes(settings: dict, folder: Path) -> dict:
    """Where the planned (b*, T*) loses in the b* = 1 regime, and why (``causes``): per eps, whether the
    measured Y_T = ||theta_T - theta*||^2 is least at the bound's T*(b), how much of it the clipping bias alone
    leaves, and the planned point under random cohorts."""
    from dpfl.papers.zhou2021 import causes
    from dpfl.papers.zhou2021.experiment import Setup, estimate, optimum

    setup = Setup(**settings["setup"])
    est, target, noiseless = estimate(setup), optimum(setup), {}
    shapes = [causes.shape_and_terms(setup, est, target, eps, tuple(settings["rounds"]),
                                              settings["repeats"], noiseless) for eps in settings["epsilons"]]
    counted = [causes.reply_counting(setup, est, target, eps, settings["repeats"])
               for eps in settings["epsilons"]]
    replanned = [causes.replanned(setup, est, target, eps) for eps in settings["epsilons"]]
    (folder / "causes.md").write_text(causes.tables({"shape": shapes, "constants": replanned,
                                                              "replies": counted}))
    rows = []
    for part, replies, again in zip(shapes, counted, replanned):
        eps, joint = part["epsilon"], part["joint"]
        for b in sorted({r["clients_per_round"] for r in part["rows"]}):
            mine = [r for r in part["rows"] if r["clients_per_round"] == b]
            planned = next(r for r in mine if r["planned"])
            best = min(mine, key=lambda r: r["measured"])
            rows.append(Row(f"eps = {eps:g}, b = {b}: the measured Y_T = ||theta_T - theta*||^2 is least at the "
                            f"bound's T*(b) = {planned['rounds']}", "holds",
                            f"least at T = {best['rounds']} ({best['measured']:.3g}); at T*: "
                            f"{planned['measured']:.3g}", None, best is planned))
            rows.append(Row(f"eps = {eps:g}, b = {b}, T* = {planned['rounds']}: U's optimisation and noise terms "
                            "against the measured noise-free (unclipped) Y_T and noise share (noisy less "
                            "noise-free Y_T at the clip)", None,
                            f"{planned['bound_optimisation']:.3g} vs {planned['noiseless_unclipped']:.3g}; "
                            f"{planned['bound_noise']:.3g} vs "
                            f"{planned['measured'] - planned['noiseless_clipped']:.3g}", None, None))
            floor = planned["noiseless_clipped"] / planned["measured"]
            rows.append(Row(f"eps = {eps:g}, b = {b}, T* = {planned['rounds']}: the share of Y_T left without noise "
                            "by the clip alone (xi_1 = 2; unclipped, noise-free runs end at "
                            f"{planned['noiseless_unclipped']:.2g})", None, f"{floor:.2f}", None, None,
                            "Theorem 3 assumes xi_1 bounds every per-sample gradient: its bound has no clipping "
                            "bias"))
        everything = {(r["clients_per_round"], r["rounds"]): r for r in part["rows"]}
        key = (joint["clients_per_round"], joint["rounds"])
        rival = min((k for k in everything if k != key), key=lambda k: everything[k]["train_loss"])
        ours = everything[key]["train_loss"] if key in everything else None
        rows.append(Row(f"eps = {eps:g}: the planned (b*, T*) = {key} has the least final loss of the points run",
                        "holds", f"{ours:.3f}; best other {everything[rival]['train_loss']:.3f} at {rival}"
                        if ours is not None else "not run", None,
                        ours is not None and ours <= everything[rival]["train_loss"]))
        rows.append(Row(f"eps = {eps:g}: T*(1) re-planned with G at theta* ({again['G_at_optimum']:.2g}, not the "
                        f"path's worst {again['G']:.2g}), then also with Y0 = 0", None,
                        ", ".join(f"{t}" for t in again["rounds"].values()), None, None,
                        "the gamma Y0 / (T + gamma) term sets most of T*"))
        rows.append(Row(f"eps = {eps:g}: the planned {key} with random cohorts (calibrated to the most replies of any "
                        "client) against round robin (ceil(b T / N), the plan's count): final loss", None,
                        f"{replies['random']['train_loss']:.3f} against {replies['round-robin']['train_loss']:.3f}",
                        None, None))
    return {"rows": rows, "constants": est.to_dict(), "shape": shapes, "replanned": replanned, "replies": counted}


#: What zhou2021-causes shows (3 seeds; docs/experiments/zhou2021.md, "Why the plan loses").
WHY_CAUSES = (
    "on breast cancer with weight decay 2 (F* = 0.41 against ln 2 = 0.69 at chance, 91-93% test accuracy at the plans) "
    "b* = 1 is right (b = 1 has the least loss at every T >= 50) but T* = 230 / 470 (eps 5 / 10) is 4.6x / 9.4x the "
    "measured best T = 50 (final loss 0.601 / 0.561 against 0.548 / 0.551). Cause: the bound's optimisation term "
    "falls as gamma Y0 / (T + gamma) while the runs' noise-free error falls as (gamma / (T + gamma))^4 and sits at "
    "the clipping floor (0.058, 62-83% of Y_T at T*) by T = 50; its noise term is only 2-3.5x the measured one. With "
    "G at theta* and Y0 = 0 the plan would be T*(1) = 30 / 60. Round robin (the exact count) does not close it: "
    "random cohorts end at 0.630 / 0.594")


ITEMS = [
    Item("zhou2021-table1", PAPER, "Table I: T* and b* planned for Laplace noise, MNIST and FEMNIST",
         "Table I", REPRODUCED,
         "Eq. 6, the KKT candidates and b* rounded up give all 24 entries from three constants per data set fitted "
         "to the table (the paper does not state its constants)", _table_settings, _table),
    Item("zhou2021-loss", PAPER, "Figs. 2-3: final loss against T for b in {1, 5, 10}, Laplace, eps in {1, 5, 10}",
         "Sec. VI-A and Figs. 2-3 (curves; the claims are stated in the text)", DIFFERS,
         "the loss grows with T and b = 1 is (nearly always) best, as in the paper, but the joint plan takes b* = N "
         "and is not the grid's best on digits; quick: digits (1,797 records) for MNIST, 1 seed",
         _loss_settings, _loss, data="mnist",
         substitute="scikit-learn's digits, 1 seed", research_mode=True),
    Item("zhou2021-gaussian", PAPER, "Sec. VI-B: the Gaussian mechanism prefers b = N",
         "Sec. VI-B (stated in the text)", REPRODUCED,
         "the final loss after T = 100 queries falls with b at every eps, as the paper says (the planner's T* = 0, "
         "no training at all, ends below every run: at these eps the noise outweighs what any run learns); quick: "
         "digits for MNIST, 1 seed", _gaussian_settings, _gaussian, data="mnist",
         substitute="scikit-learn's digits, 1 seed", research_mode=True),
    Item("zhou2021-fig1", PAPER, "Fig. 1 (a): loss per global iteration for several (b, T) and the planned (b*, T*), "
         "Laplace, in the paper's regime (b* = 1)", "Fig. 1 and Sec. VII-B1 (curves; the claims are stated in the "
         "text); the joint T* of Table I", DIFFERS,
         "where b* = 1 comes with real learning (quick: breast cancer, weight decay 2, gamma = 8.5; F* = 0.41 "
         "against ln 2 = 0.69 at chance) the planner is b* = 1 with T* = 230, 470 at eps 5, 10 (Table I on MNIST: "
         "121, 244; b* = N, T* = 4 at eps 1), but the planned curve ends above the best at every eps (eps 5: 0.582 "
         "against 0.573 at (5, 60); eps 10: 0.569 against 0.549 at (10, 77); eps 1: 0.738 against 0.629 at (1, 40)): "
         "T* is too large, with round-robin cohorts, whose reply count is the plan's (zhou2021-causes: the bound's "
         "optimisation term falls as 1 / T); 1 seed", _fig1_settings, _fig1,
         data="mnist", substitute="scikit-learn's breast cancer standardised per client, weight decay 2 (on digits "
                                  "weight decay 1 leaves F* = 2.21 against ln 10 = 2.30), a grid of b in {1, 5, 10} "
                                  "x T in {10, 100} beside the plans, 1 seed",
         research_mode=True),
    Item("zhou2021-data-size", PAPER, "Figs. 7-8 (a): test accuracy at the planned (b*, T*) against the portion of "
         "data used and eps, Laplace", "Sec. VII-B4 (curves; the claims are stated in the text)", DIFFERS,
         "where b* = 1 learns (quick: breast cancer, weight decay 2) the accuracy at the planned (b*, T*) is 0.43 to "
         "0.95 over 10 to 100% of the data and eps 1 to 100 (0.84 / 0.93 / 0.95 with all of it at eps 1 / 10 / 100) "
         "and grows with the portion at 2 of 3 eps and with eps at 2 of 4 portions; 1 seed, and the test split "
         "shrinks with the portion (10 test records in all at 10%; the paper keeps its test set)",
         _size_settings, _size, data="mnist",
         substitute="scikit-learn's breast cancer standardised per client, weight decay 2 (on digits weight decay 1 "
                    "left the plans' accuracy near chance), portions 10, 30, 60, 100%, eps 1, 10 and 100, 1 seed",
         research_mode=True),
    Item("zhou2021-causes", PAPER, "Where the planned (b*, T*) loses where b* = 1 learns, and why: one experiment "
         "per suspected cause (the bound's terms, clipping, its constants, the reply count)",
         "Sec. V-B (T* and b* minimise the bound, so the final loss) and Fig. 1 (the planned curve ends lowest)",
         DIFFERS, WHY_CAUSES, _causes_settings, _causes, research_mode=True),
]
