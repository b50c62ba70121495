"""Placement: gangs, shared GPUs packed best-fit, topology islands, cores, and what grants leave."""

from __future__ import annotations

from dataclasses import replace

from jupyter_dlsched.policy import Room
from jupyter_dlsched.vocab.placement import fits_ever, place
from jupyter_dlsched.vocab.resources import Capacity, GpuFree, Placement, Request

GIB = 2**30


def pool(gpus: int = 4, mem: int = 16 * GIB) -> Capacity:
    return Capacity.empty(n_gpus=gpus, gpu_mem=mem, cpus=8, mem=64 * GIB)


def test_a_gang_gets_all_its_gpus_or_nothing():
    cap = pool(4).take(place(Request(gpus=3), pool(4)))
    assert place(Request(gpus=2), cap) is None
    assert place(Request(gpus=1), cap).gpus == (3,)


def test_one_gpu_goes_to_the_first_free_card_with_enough_memory():
    cap = Capacity(
        gpus=(
            GpuFree(0, 8 * GIB, 8 * GIB),
            GpuFree(1, 40 * GIB, 0, jobs=1),
            GpuFree(2, 40 * GIB, 40 * GIB),
        ),
        cpu_load=(0.0,) * 4,
        mem_free=GIB,
        mem_total=GIB,
    )
    assert place(Request(gpus=1, cpus=0), cap).gpus == (0,)
    assert place(Request(gpus=1, gpu_mem=16 * GIB, cpus=0), cap).gpus == (2,)


def test_shared_gpus_are_packed_best_fit_and_never_onto_a_card_held_whole():
    cap = pool(3)
    cap = cap.take(place(Request(gpus=1), cap))  # card 0 held whole
    cap = cap.take(place(Request(gpus=0.5, gpu_mem=10 * GIB), cap))  # card 1: 6 GiB left
    p = place(Request(gpus=0.25, gpu_mem=4 * GIB), cap)
    assert p.gpus == (1,) and p.shared and p.gpu_mem == (4 * GIB,)


def test_a_gang_prefers_the_smallest_topology_island_that_fits():
    gpus = tuple(GpuFree(i, GIB, GIB, group=0 if i < 4 else 1) for i in range(6))
    cap = Capacity(gpus, (0.0,) * 8, GIB, GIB)
    assert place(Request(gpus=2, cpus=0), cap).gpus == (4, 5)
    assert place(Request(gpus=4, cpus=0), cap).gpus == (0, 1, 2, 3)


def test_cpu_shares_go_to_the_least_loaded_cores():
    cap = replace(pool(0), cpu_load=(1.0, 0.0, 0.5, 0.0))
    assert place(Request(gpus=0, cpus=2), cap).cpus == (1, 3)


def test_granting_and_giving_back_restore_the_capacity_exactly():
    cap = pool(4)
    p = place(Request(gpus=2, cpus=2, mem=GIB), cap)
    assert cap.take(p).give_back(p) == cap
    assert cap.take(p).free_whole_gpus == 2


def test_grants_are_the_same_whatever_order_the_gpus_are_listed_in():
    p = Placement(gpus=(2,), gpu_mem=(GIB,))
    ordered = Capacity(tuple(GpuFree(i, GIB, GIB) for i in range(4)), (), 0, 0)
    shuffled = replace(ordered, gpus=tuple(reversed(ordered.gpus)))
    taken = {g.index: g for g in ordered.take(p).gpus}
    assert taken == {g.index: g for g in shuffled.take(p).gpus}
    assert taken[2].jobs == 1 and taken[2].mem_free == 0


def test_room_rejects_what_cannot_fit_without_searching_and_agrees_with_place():
    room = Room(pool(4))
    fitted = []
    for request in (Request(gpus=3), Request(gpus=2), Request(gpus=1)):
        got = room.place(request)
        assert got == place(request, room.capacity)
        fitted.append(got is not None)
        if got is not None:
            room.take(got)
    assert fitted == [True, False, True]
    assert room.whole == room.capacity.free_whole_gpus == 0


def test_fits_ever_says_why_a_request_can_never_run_here():
    assert fits_ever(Request(gpus=8), pool(4)) == "requests 8 GPUs; this pool has 4"
    assert fits_ever(Request(gpus=2), pool(4)) is None
