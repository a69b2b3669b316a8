"""engine.placement.pin_worker: each pytest-xdist worker's CPU threads and GPU, set before torch starts."""
from clharness.engine.placement import pin_worker


def test_each_worker_takes_its_share_of_the_cores_unless_the_caller_set_it():
    env = {}
    pin_worker(0, 3, "cpu", env, cpus=16)
    assert env == {"OMP_NUM_THREADS": "5"}            # 16 // 3
    env = {}
    pin_worker(2, 32, "cpu", env, cpus=16)
    assert env == {"OMP_NUM_THREADS": "1"}            # never below one thread
    env = {"OMP_NUM_THREADS": "7"}
    pin_worker(1, 2, "cpu", env, cpus=16)
    assert env == {"OMP_NUM_THREADS": "7"}            # the caller's setting stands


def test_each_worker_takes_one_of_the_visible_gpus_in_turn_and_cpu_runs_leave_them_alone():
    picked = []
    for index in range(5):
        env = {"CUDA_VISIBLE_DEVICES": "3,5,7"}
        pin_worker(index, 5, "auto", env, cpus=10)
        picked.append(env["CUDA_VISIBLE_DEVICES"])
    assert picked == ["3", "5", "7", "3", "5"]
    env = {"CUDA_VISIBLE_DEVICES": "3,5"}
    pin_worker(1, 2, "cuda", env, cpus=4)
    assert env == {"CUDA_VISIBLE_DEVICES": "5", "OMP_NUM_THREADS": "2"}
    env = {"CUDA_VISIBLE_DEVICES": "3,5"}
    pin_worker(1, 2, "cpu", env, cpus=4)
    assert env["CUDA_VISIBLE_DEVICES"] == "3,5"      # --clh-device cpu: the GPUs are not this session's
    env = {"CUDA_VISIBLE_DEVICES": ""}
    pin_worker(1, 2, "auto", env, cpus=4)
    assert env["CUDA_VISIBLE_DEVICES"] == ""         # none visible: nothing to pick
