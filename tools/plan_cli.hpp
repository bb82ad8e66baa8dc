#pragma once
/// The command-line conventions every `xshard-plan` subcommand shares: bad input exits 2 with
/// one line on stderr ("xshard-plan: ..."), help exits 0.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>

namespace xshard_plan {

/// Bad input found after parsing (reported like a parse error: one line, exit 2).
struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Parses argv into `app`; returns the exit status when parsing ends the program (help: 0,
/// a parse error: 2 after one line on stderr), nothing when the command goes on.
inline std::optional<int> parse_arguments(CLI::App& app, int argc, char** argv) {
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::fprintf(stderr, "xshard-plan: %s (see --help)\n", e.what());
        return 2;
    }
    return std::nullopt;
}

/// Reports a failure of the command in one line (without the library's "xshard: " prefix)
/// and returns the exit status 2.
inline int report_failure(const std::exception& e) {
    std::string what = e.what();
    if (what.rfind("xshard: ", 0) == 0)
        what = what.substr(8);
    std::fprintf(stderr, "xshard-plan: %s\n", what.c_str());
    return 2;
}

} // namespace xshard_plan
