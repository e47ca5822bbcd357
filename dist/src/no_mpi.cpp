// The build without MPI.
#include "mpi_world.h"
#include "tvc/error.h"

namespace tvc::dist::detail {

bool mpi_built() { return false; }

CommunicatorPtr mpi_world() { throw Error("tvc was built without MPI (meson option -Dmpi=enabled)"); }

void mpi_abort(int) { throw Error("tvc was built without MPI (meson option -Dmpi=enabled)"); }

}  // namespace tvc::dist::detail
