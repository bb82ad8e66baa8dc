// A program whose `main` is report_errors (comm/report_errors.hpp) and whose body fails as the
// first argument says; ctest checks its exit status and that the message is printed once:
//   ok            returns 0 on every rank
//   every_rank    throws xshard::error on every rank: rank 0 prints it, exit status 1
//   std_error     throws std::invalid_argument on every rank (not an xshard::error): the same
//   one_rank [ms] the last rank throws std::runtime_error while the others wait in a
//                 barrier (that would never end): it prints the message after its rank and
//                 the job is aborted (a status that is not 0) once report_errors has waited
//                 ms milliseconds for the others (10 s by default); one rank alone: as
//                 every_rank
//   in_scope      inside a failure scope (`agreed`), the last rank throws between two
//                 all-reduces: the others' second all-reduce ends with peer_failure, every
//                 rank raises, and rank 0 prints the failing rank's message once (exit 1)
#include <xshard/comm/agree.hpp>
#include <xshard/comm/collectives.hpp>
#include <xshard/comm/environment.hpp>
#include <xshard/comm/report_errors.hpp>

#include <chrono>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    const std::string mode = argc > 1 ? argv[1] : "";
    const auto agreement = argc > 2 ? std::chrono::milliseconds(std::stol(argv[2]))
                                    : xshard::failure_agreement_timeout;
    return xshard::report_errors([&] {
        const auto world = xshard::communicator::world();
        if (mode == "every_rank")
            throw xshard::error("xshard: the test's error, raised on every rank");
        if (mode == "std_error")
            throw std::invalid_argument("the test's std::invalid_argument, on every rank");
        if (mode == "one_rank") {
            if (world.rank() == world.size() - 1)
                throw std::runtime_error("the test's error on the last rank alone");
            xshard::mpi::barrier(world); // never completes: the last rank does not come
        }
        if (mode == "in_scope") {
            auto quiet = xshard::current_watch_settings();
            quiet.print_on_failure = false;
            xshard::set_watch_settings(quiet);
            xshard::agreed(world, [&] {
                int v = 1;
                xshard::mpi::allreduce(world, std::span(&v, 1), xshard::reduction::sum);
                if (world.rank() == world.size() - 1)
                    throw std::runtime_error("the test's error between two collectives");
                xshard::mpi::allreduce(world, std::span(&v, 1), xshard::reduction::sum);
            });
        }
        if (mode != "ok" && mode != "one_rank")
            throw xshard::error(
                "usage: report_errors_program ok|every_rank|std_error|one_rank|in_scope");
        if (world.rank() == 0)
            std::printf("report_errors: the program returned normally\n");
        return 0;
    }, agreement);
}
