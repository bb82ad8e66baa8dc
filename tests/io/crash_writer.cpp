// The process tests/io/crash_test.sh kills: saves checkpoints of a model (tests/io/model.hpp
// plus an 8 MiB tensor, so that a save takes a while), step after step, until killed; and
// checks afterwards that the checkpoint left behind loads, checksums and all, and holds the
// values of one complete step.
//
//   crash_writer once|loop|verify PATH integrated|per_rank
#include <xshard/comm/environment.hpp>
#include <xshard/io/checkpoint.hpp>

#include "model.hpp"

#include <cstdio>
#include <string>
#include <tuple>

using namespace xshard::testing;

namespace {

struct model {
    net small;
    dyn<double, 2> big;

    explicit model(const ckpt_mesh& m)
        : small(m, saved_layouts)
        , big(xshard::zeros<double, xshard::dynamic_layout(2)>(m, {1024, 1024}, "[-, mp]")) {}

    friend void visit_parameters(model& n, auto&& visit) {
        visit("small", n.small);
        visit("big", n.big);
    }
};

} // namespace

int main(int argc, char** argv) {
    xshard::environment env(argc, argv);
    if (argc != 4) {
        std::fprintf(stderr, "usage: crash_writer once|loop|verify PATH integrated|per_rank\n");
        return 2;
    }
    const std::string mode = argv[1], path = argv[2], format = argv[3];
    const auto w = xshard::communicator::world();
    const ckpt_mesh mesh(w, {1, w.size()});
    model m(mesh);
    if (mode == "verify") {
        const auto info = xshard::load_checkpoint(path, m); // throws if damaged
        const auto bad =
            m.small.mismatches_all(info.step, false) + mismatches(m.big, "big", info.step);
        if (mesh.rank() == 0)
            std::printf("loaded step %lld: %s\n", static_cast<long long>(info.step),
                        bad ? "WRONG VALUES" : "ok");
        return bad || info.step < 1 ? 1 : 0;
    }
    const xshard::checkpoint_options options{.format = format == "integrated"
                                                           ? xshard::checkpoint_format::integrated
                                                           : xshard::checkpoint_format::per_rank};
    for (std::int64_t step = 1; mode == "loop" || step == 1; ++step) {
        m.small.fill_all(step);
        fill(m.big, "big", step);
        auto o = options;
        o.step = step;
        xshard::save_checkpoint(path, m, o);
    }
}
