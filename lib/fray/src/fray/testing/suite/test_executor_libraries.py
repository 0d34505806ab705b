"""Libraries that take an executor, on fray: joblib (and so scikit-learn's n_jobs) and Dask's local scheduler.

Each test skips, naming the package, where that package is not installed (fray-core[joblib], fray-core[dask];
the test extra installs them)."""

from __future__ import annotations

import pytest

from fray.context import JobContext

TIMEOUT = 120.0


def test_joblib_parallel_runs_on_fray(fray_ctx: JobContext) -> None:
    joblib = pytest.importorskip("joblib", reason="joblib is not installed (pip install 'fray-core[joblib]')")
    import fray.joblib

    fray.joblib.register()
    with joblib.parallel_config(backend="fray", n_jobs=-1):
        assert joblib.Parallel()(joblib.delayed(pow)(i, 2) for i in range(50)) == [i * i for i in range(50)]
    with joblib.parallel_config(backend="fray", n_jobs=2), pytest.raises(ZeroDivisionError):
        joblib.Parallel()(joblib.delayed(divmod)(1, i) for i in (3, 2, 0, 1))


def test_scikit_learn_grid_search_runs_on_fray(fray_ctx: JobContext) -> None:
    joblib = pytest.importorskip("joblib", reason="joblib is not installed (pip install 'fray-core[joblib]')")
    pytest.importorskip("sklearn", reason="scikit-learn is not installed (the test extra installs it)")
    from sklearn.datasets import load_iris
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import GridSearchCV

    import fray.joblib

    fray.joblib.register()
    features, labels = load_iris(return_X_y=True)
    search = GridSearchCV(LogisticRegression(max_iter=300), {"C": [0.1, 1.0, 10.0]}, cv=3, n_jobs=-1)
    with joblib.parallel_config(backend="fray"):
        search.fit(features, labels)
    assert search.best_params_["C"] in (0.1, 1.0, 10.0)
    assert len(search.cv_results_["mean_test_score"]) == 3
    assert search.best_score_ > 0.9


def test_dask_array_and_bag_compute_on_a_fray_executor(fray_ctx: JobContext) -> None:
    dask = pytest.importorskip("dask", reason="dask is not installed (pip install 'fray-core[dask]')")
    import dask.array as da
    import dask.bag as db

    with fray_ctx.executor() as executor:
        x = da.arange(10_000, chunks=1_000).reshape(100, 100)
        (total, column_means) = dask.compute(x.sum(), x.mean(axis=0), scheduler=executor)
        assert int(total) == sum(range(10_000))
        assert column_means.shape == (100,) and float(column_means[0]) == pytest.approx(4950.0)
        numbers = db.from_sequence(range(100), npartitions=4)  # type: ignore[no-untyped-call]
        bag = numbers.map(_double).filter(_even_tens)
        assert dask.compute(bag.sum(), scheduler=executor)[0] == sum(2 * i for i in range(100) if (2 * i) % 10 == 0)


def _double(x: int) -> int:
    return 2 * x


def _even_tens(x: int) -> bool:
    return x % 10 == 0
