#pragma once
/// \file
/// The definitions of what io/operator_strategy_file.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/operator_strategy_file.hpp>

namespace xshard {

XSHARD_DECL void save_operator_strategy(const std::string& path, const operator_strategy& s) {
    try {
        detail::write_file_atomically(path, s.to_json());
    } catch (const io_error&) {
        throw;
    } catch (const std::exception& e) {
        throw io_error("xshard: cannot write the operator strategy file " + path + ": " + e.what());
    }
}

} // namespace xshard

