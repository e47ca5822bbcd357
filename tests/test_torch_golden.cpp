// The golden cache (tests/torch_golden.h): golden folders are kept within TVC_GOLDEN_CACHE_GIB,
// the least recently used first to go, never one a test holds.
#include <fcntl.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "test_helpers.h"
#include "torch_golden.h"

namespace tvc {
namespace {

namespace fs = std::filesystem;

// Makes the folder "used" (its last use) an hour before now.
void use_an_hour_ago(const fs::path& folder) {
  fs::last_write_time(folder / "complete", fs::file_time_type::clock::now() - std::chrono::hours(1));
}

TEST(GoldenCache, KeepsItsBudgetByRemovingTheLeastRecentlyUsedFoldersNoTestHolds) {
  test::TempDir cache, scripts;
  test::ScopedEnv at("TVC_GOLDEN_CACHE", cache.path().string());
  test::ScopedEnv budget("TVC_GOLDEN_CACHE_GIB", "0.0015");  // 1.5 MiB: one 1 MiB folder and a half
  // A golden script: ARGS are a tag and a size, the last argument the folder to write.
  const std::string script = scripts / "write_bytes.py";
  test::write_file(script,
                   "import os, sys\n"
                   "out = sys.argv[-1]\n"
                   "open(os.path.join(out, 'data'), 'wb').write(os.urandom(int(sys.argv[2])))\n"
                   "open(os.path.join(out, 'complete'), 'w').write('ok')\n");
  auto folder = [&](const char* tag) { return fs::path(test::python_golden_folder(script, {tag, "1048576"})); };

  // Three folders held by this test: over the budget, all kept.
  const fs::path a = folder("a"), b = folder("b"), c = folder("c");
  ASSERT_FALSE(a.empty());
  ASSERT_TRUE(a != b && b != c);
  EXPECT_TRUE(fs::exists(a / "complete") && fs::exists(b / "complete") && fs::exists(c / "complete"));
  EXPECT_EQ(fs::file_size(a / "data"), 1048576u);
  test::write_file(b / "marker", "");
  EXPECT_EQ(folder("b"), b);  // found again (now the most recently used), the script not run again
  EXPECT_TRUE(fs::exists(b / "marker"));

  // Released, the least recently used go first, as many as the budget needs (a, then c); so do
  // the folders a dead process was writing or removing, not those of a live one.
  test::release_golden_folders();
  use_an_hour_ago(a);
  const fs::path dead_writer = cache.path() / "files-0123456789abcdef.tmp-2147483647";
  const fs::path dead_evicter = cache.path() / "files-0123456789abcdef.evict-2147483647";
  const fs::path live_writer = cache.path() / ("files-fedcba9876543210.tmp-" + std::to_string(::getpid()));
  for (const fs::path& p : {dead_writer, dead_evicter, live_writer}) fs::create_directories(p);
  const fs::path d = folder("d");
  EXPECT_FALSE(fs::exists(a) || fs::exists(c));
  EXPECT_TRUE(fs::exists(b / "marker") && fs::exists(d / "complete"));
  EXPECT_FALSE(fs::exists(dead_writer) || fs::exists(dead_evicter));
  EXPECT_TRUE(fs::exists(live_writer));

  // A folder another test process holds (a shared lock on its `complete`) stays, least recently
  // used or not; the next one goes instead.
  test::release_golden_folders();
  use_an_hour_ago(b);
  const int other_test = ::open((b / "complete").c_str(), O_RDONLY);
  ASSERT_GE(other_test, 0);
  ASSERT_EQ(::flock(other_test, LOCK_SH), 0);
  const fs::path e = folder("e");
  ::close(other_test);
  EXPECT_TRUE(fs::exists(b / "marker") && fs::exists(e / "complete"));
  EXPECT_FALSE(fs::exists(d));

  // A folder the test lets go of before it ends can go; one it still holds stays.
  test::release_golden_folders();
  const fs::path f = folder("f"), g = folder("g");
  test::release_golden_folder(f.string());
  const fs::path h = folder("h");
  EXPECT_FALSE(fs::exists(f));
  EXPECT_TRUE(fs::exists(g / "complete") && fs::exists(h / "complete"));

  // A budget that is not a number is a failure that names the variable.
  test::release_golden_folders();
  test::ScopedEnv wrong("TVC_GOLDEN_CACHE_GIB", "2GB");
  EXPECT_NONFATAL_FAILURE(folder("i"), "TVC_GOLDEN_CACHE_GIB='2GB' is not a size in GiB");
  test::release_golden_folders();
}

}  // namespace
}  // namespace tvc
