"""Check your own composition with mrkit's testing kit (conformance + a Hypothesis state machine)."""
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import mrkit
from mrkit.testing import make_state_machine, run_conformance


def my_stack(driver):
    return mrkit.StatisticsAdaptor(mrkit.PoolResource(mrkit.CudaMemoryResource(driver=driver)))


print("conformance checks passed:", run_conformance(my_stack, backend="sim"))
Machine = make_state_machine(my_stack, backend="sim", max_streams=4)
run_state_machine_as_test(Machine, settings=settings(max_examples=20, stateful_step_count=30, deadline=None))
print("state machine: no overlap, no leaks, no stream-order violations")
