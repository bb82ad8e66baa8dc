// What the README's first example prints on 2 ranks, worked out without xshard: the drawing
// written out by hand from the partition rule (mesh dp = 1, mp = 2; the 6x4 matrix split
// [dp, mp] gives rank 0 columns 0:2 and rank 1 columns 2:4, all rows), and the sum from a
// serial xtensor computation (2 a + b + 1 with a = xt::random::rand(mt19937(42)), b = 1).
// Writes the text to the file named by its argument.

#include <xtensor/xrandom.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>

#include <cstdio>
#include <random>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: readme_expected_output FILE\n");
        return 2;
    }
    std::mt19937 engine(42);
    const xt::xtensor<double, 2> a = xt::random::rand<double>({6, 4}, 0.0, 1.0, engine);
    const double sum = xt::sum(2.0 * a + 1.0 + 1.0)();
    std::FILE* out = std::fopen(argv[1], "w");
    if (!out)
        return 1;
    std::fprintf(out,
                 "[dp, mp] (6, 4) on mesh(dp=1, mp=2)\n"
                 "+------------+------------+\n"
                 "|   rank 0   |   rank 1   |\n"
                 "| [0:6, 0:2] | [0:6, 2:4] |\n"
                 "+------------+------------+\n"
                 "sum = %.3f\n",
                 sum);
    return std::fclose(out) == 0 ? 0 : 1;
}
