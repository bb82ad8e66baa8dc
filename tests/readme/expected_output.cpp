// What the README's first example prints on 2 and on 4 ranks, worked out without xshard:
// the drawing written out by hand from the partition rule (the 6x4 matrix split [dp, mp] on
// mesh dp = 1, mp = 2 gives rank 0 columns 0:2 and rank 1 columns 2:4, all rows; on 2 x 2,
// rows 0:3 and 3:6 too), and the sum from a serial xtensor computation (2 a + b + 1 with
// a = xt::random::rand(mt19937(42)), b = 1). Writes the text to the file named by its first
// argument, for the number of ranks its second argument names.

#include <xtensor/xrandom.hpp>
#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>

#include <cstdio>
#include <random>
#include <string>

int main(int argc, char** argv) {
    const std::string ranks = argc == 3 ? argv[2] : "";
    if (ranks != "2" && ranks != "4") {
        std::fprintf(stderr, "usage: readme_expected_output FILE 2|4\n");
        return 2;
    }
    std::mt19937 engine(42);
    const xt::xtensor<double, 2> a = xt::random::rand<double>({6, 4}, 0.0, 1.0, engine);
    const double sum = xt::sum(2.0 * a + 1.0 + 1.0)();
    std::FILE* out = std::fopen(argv[1], "w");
    if (!out)
        return 1;
    if (ranks == "2")
        std::fprintf(out, "[dp, mp] (6, 4) on mesh(dp=1, mp=2)\n"
                          "+------------+------------+\n"
                          "|   rank 0   |   rank 1   |\n"
                          "| [0:6, 0:2] | [0:6, 2:4] |\n"
                          "+------------+------------+\n");
    else
        std::fprintf(out, "[dp, mp] (6, 4) on mesh(dp=2, mp=2)\n"
                          "+------------+------------+\n"
                          "|   rank 0   |   rank 1   |\n"
                          "| [0:3, 0:2] | [0:3, 2:4] |\n"
                          "+------------+------------+\n"
                          "|   rank 2   |   rank 3   |\n"
                          "| [3:6, 0:2] | [3:6, 2:4] |\n"
                          "+------------+------------+\n");
    std::fprintf(out, "sum = %.3f\n", sum);
    return std::fclose(out) == 0 ? 0 : 1;
}
