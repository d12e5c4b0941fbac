// Our 64-bit tags in MPI's tag space (src/comm/mpi/mpi_tags.h): every tag a
// collective can make stays within MPI_TAG_UB, library channels keep slot 0,
// and tags of collectives fewer than a window apart never share an MPI tag.
#include "comm/mpi/mpi_tags.h"

#include <gtest/gtest.h>

#include <set>

#include "comm/algorithms.h"
#include "comm/fingerprint.h"

namespace lockstep::comm::detail {
namespace {

TEST(MpiTags, WindowFollowsTagUpperBound) {
  EXPECT_EQ(mpi_tag_window(2147483647), 32768u);  // OpenMPI ob1
  EXPECT_EQ(mpi_tag_window(8388607), 128u);       // OpenMPI ucx
  EXPECT_EQ(mpi_tag_window(32767), 0u);           // the standard's minimum: too small, refused at connect
}

TEST(MpiTags, EveryTagFitsAndLibraryChannelsKeepSlotZero) {
  for (int tag_ub : {2147483647, 8388607}) {
    const std::uint64_t w = mpi_tag_window(tag_ub);
    EXPECT_EQ(to_mpi_tag(kFingerprintTag, w), 0);
    EXPECT_NE(to_mpi_tag(kFingerprintTag, w), kAbortNoticeMpiTag);
    for (std::uint64_t seq : {std::uint64_t{0}, std::uint64_t{1}, w - 2, w - 1, w, std::uint64_t{1} << 40}) {
      for (std::uint32_t round : {0u, 1u, 14u, 0xfffeu, 0xffffu}) {
        const int t = to_mpi_tag(make_tag(seq, round), w);
        EXPECT_GE(t, 1 << 16) << "seq " << seq << " round " << round;  // never slot 0
        EXPECT_LE(t, tag_ub) << "seq " << seq << " round " << round;
        EXPECT_EQ(t & 0xffff, static_cast<int>(round));  // the round is kept exactly
      }
    }
  }
}

TEST(MpiTags, CollectivesFewerThanAWindowApartNeverShareATag) {
  const std::uint64_t w = mpi_tag_window(8388607);  // the small window, so the test walks all of it
  for (std::uint64_t start : {std::uint64_t{0}, std::uint64_t{12345}}) {
    std::set<int> seen;
    for (std::uint64_t seq = start; seq < start + w - 1; ++seq)
      for (std::uint32_t round = 0; round < 20; ++round)
        EXPECT_TRUE(seen.insert(to_mpi_tag(make_tag(seq, round), w)).second) << seq << " " << round;
    // ... and the window wraps: w - 1 collectives later the tags repeat.
    EXPECT_EQ(to_mpi_tag(make_tag(start, 3), w), to_mpi_tag(make_tag(start + w - 1, 3), w));
  }
}

// Errors name a tag by who made it: the library keeps bits 62 and 63, so a
// program's tag (below 2^62) is never described as a collective's round.
TEST(MpiTags, DescribeTagTellsAProgramsTagsFromTheLibrarys) {
  EXPECT_EQ(describe_tag(7), "tag 7");
  EXPECT_EQ(describe_tag((std::uint64_t{1} << 62) - 1), "tag " + std::to_string((std::uint64_t{1} << 62) - 1));
  EXPECT_EQ(describe_tag(make_tag(0, 7)), "collective seq 0, round 7");
  EXPECT_EQ(describe_tag(make_tag(599, 4)), "collective seq 599, round 4");
  EXPECT_EQ(describe_tag(kFingerprintTag), "fingerprint check");
  EXPECT_EQ(describe_tag(kLibraryChannelBit | 2), "library channel 2");
  // The MPI fold keeps a collective's slot where the window argument above puts it.
  const std::uint64_t w = mpi_tag_window(2147483647);
  EXPECT_EQ(to_mpi_tag(make_tag(5, 3), w), static_cast<int>((1 + 5) << 16 | 3));
}

}  // namespace
}  // namespace lockstep::comm::detail
