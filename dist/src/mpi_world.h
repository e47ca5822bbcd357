// The MPI communicator (dist/src/mpi_world.cpp, built with the `mpi` feature) or its absence
// (dist/src/no_mpi.cpp).
#pragma once

#include "tvc/dist/communicator.h"

namespace tvc::dist {

// Throws unless t is a contiguous CPU tensor of float32, float64 or int64 (what names the call).
void check_collective(const Tensor& t, const char* what);

namespace detail {
bool mpi_built();
CommunicatorPtr mpi_world();            // MPI_COMM_WORLD, MPI initialised once; only when mpi_built()
[[noreturn]] void mpi_abort(int code);  // MPI_Abort(MPI_COMM_WORLD, code); only when mpi_built()
}  // namespace detail

}  // namespace tvc::dist
