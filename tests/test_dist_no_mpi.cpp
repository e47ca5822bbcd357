// The communicator of a build without MPI (dist/src/no_mpi.cpp, linked here whatever the build
// has): outside a launcher the world is one process; launched as one of several ranks, world()
// refuses with the message `tvc train` prints, instead of each rank training alone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>

#include "test_helpers.h"
#include "tvc/dist/communicator.h"

namespace tvc::dist {
namespace {

using ::testing::HasSubstr;

TEST(DistWithoutMpi, SeveralRanksNeedTheMpiBuild) {
  EXPECT_FALSE(mpi_available());
  ASSERT_EQ(setenv("OMPI_COMM_WORLD_SIZE", "2", 1), 0);  // as mpirun -np 2 sets it
  ASSERT_TRUE(launched_with_ranks());
  EXPECT_THAT(test::error_of([] { world(); }),
              HasSubstr("launched as one of several ranks (mpirun/srun), but tvc was built without MPI: distributed "
                        "runs need the MPI build"));
  abort_world(1);  // no MPI world was started: returns
  ASSERT_EQ(unsetenv("OMPI_COMM_WORLD_SIZE"), 0);
  ASSERT_FALSE(launched_with_ranks());
}

}  // namespace
}  // namespace tvc::dist
