// The main of every MPI test program: GoogleTest under an xshard environment. Rank 0
// prints the usual report; every rank prints its own failures prefixed with its rank,
// and after each test the ranks agree on the verdict, so a failure on rank 3 fails the
// test everywhere and rank 0 names the failing ranks.

#include <xshard/comm/collectives.hpp>
#include <xshard/comm/environment.hpp>

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

namespace {

class rank_reporter : public ::testing::EmptyTestEventListener {
public:
    explicit rank_reporter(xshard::communicator world)
        : world_(std::move(world)) {}

    void OnTestPartResult(const ::testing::TestPartResult& result) override {
        if (!result.failed())
            return;
        std::fprintf(stderr, "[rank %d of %d] %s:%d: %s\n", world_.rank(), world_.size(),
                     result.file_name() ? result.file_name() : "?", result.line_number(),
                     result.message());
    }

    void OnTestEnd(const ::testing::TestInfo& info) override {
        const int failed = info.result()->Failed() ? 1 : 0;
        std::vector<int> all(std::size_t(world_.size()));
        xshard::mpi::allgather(world_, std::span(&failed, 1), all);
        std::string ranks;
        for (std::size_t r = 0; r < all.size(); ++r)
            if (all[r])
                ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
        if (ranks.empty())
            return;
        if (!failed)
            ADD_FAILURE() << "the test failed on rank(s) " << ranks;
        else if (world_.rank() == 0)
            std::fprintf(stderr, "%s.%s failed on rank(s) %s\n", info.test_suite_name(),
                         info.name(), ranks.c_str());
    }

private:
    xshard::communicator world_;
};

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    ::testing::InitGoogleTest(&argc, argv);
    auto world = xshard::communicator::world();
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (world.rank() != 0)
        delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new rank_reporter(world));
    int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
    xshard::mpi::allreduce(world, std::span(&failed, 1), xshard::reduction::max);
    return failed;
}
