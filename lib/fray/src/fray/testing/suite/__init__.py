"""The conformance tests. `from fray.testing.suite import *` in a test module collects all of them.

In this order: the cases of a JobContext first, then those that use both contexts, then those of a ClusterContext
alone. The plugin starts each session context for its first test and shuts it down after its last, so an
engine's two contexts are up together only for the middle group.
"""

# isort: off
from fray.testing.suite.test_actor_pool import *  # noqa: F403
from fray.testing.suite.test_actor_refs import *  # noqa: F403
from fray.testing.suite.test_actors import *  # noqa: F403
from fray.testing.suite.test_async import *  # noqa: F403
from fray.testing.suite.test_bounded_map import *  # noqa: F403
from fray.testing.suite.test_dataplane import *  # noqa: F403
from fray.testing.suite.test_device_values import *  # noqa: F403
from fray.testing.suite.test_errors import *  # noqa: F403
from fray.testing.suite.test_executor import *  # noqa: F403
from fray.testing.suite.test_executor_libraries import *  # noqa: F403
from fray.testing.suite.test_failures import *  # noqa: F403
from fray.testing.suite.test_gpus import *  # noqa: F403
from fray.testing.suite.test_groups import *  # noqa: F403
from fray.testing.suite.test_objects import *  # noqa: F403
from fray.testing.suite.test_options import *  # noqa: F403
from fray.testing.suite.test_receive import *  # noqa: F403
from fray.testing.suite.test_restarts import *  # noqa: F403
from fray.testing.suite.test_spmd_failures import *  # noqa: F403
from fray.testing.suite.test_streaming import *  # noqa: F403
from fray.testing.suite.test_tasks import *  # noqa: F403
from fray.testing.suite.test_thread_owners import *  # noqa: F403
from fray.testing.suite.test_timeline import *  # noqa: F403
from fray.testing.suite.test_timeouts import *  # noqa: F403
from fray.testing.suite.test_wait import *  # noqa: F403
from fray.testing.suite.test_capabilities import *  # noqa: F403
from fray.testing.suite.test_job_elastic import *  # noqa: F403
from fray.testing.suite.test_job_preemption import *  # noqa: F403
from fray.testing.suite.test_jobs import *  # noqa: F403
from fray.testing.suite.test_cluster import *  # noqa: F403
from fray.testing.suite.test_job_dependencies import *  # noqa: F403
from fray.testing.suite.test_job_dirs import *  # noqa: F403
from fray.testing.suite.test_job_retry import *  # noqa: F403
