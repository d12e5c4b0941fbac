// Test helper for the MPI tests: every rank of `mpirun -np N` runs the same
// GoogleTest program (mpi_rank_main.cpp) and the same tests in the same
// order, so each test body is one rank's side of a collective.
#pragma once

#include <memory>

#include "lockstep/comm/communicator.h"

namespace lockstep::testing {

// The communicator the whole program shares (10 s timeout). Tests that abort
// a group connect a fresh one with comm::connect_mpi instead.
comm::Communicator& mpi_world();

}  // namespace lockstep::testing
