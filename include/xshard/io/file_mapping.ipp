#pragma once
/// \file
/// The definitions of what io/file_mapping.hpp declares with XSHARD_DECL
/// (xshard/compiled.hpp).

#include <xshard/io/file_mapping.hpp>

namespace xshard::detail {

XSHARD_DECL void on_sigbus(int sig, siginfo_t* info, void* context) {
    const auto* at = static_cast<const std::byte*>(info->si_addr);
    if (fault_scope* s = guarded_access; s && at >= s->lo && at < s->hi) {
        guarded_access = nullptr;
        siglongjmp(s->jump, 1);
    }
    const auto& previous = sigbus_handlers().previous;
    if (previous.sa_flags & SA_SIGINFO) {
        previous.sa_sigaction(sig, info, context);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
    } else {
        // Returning retries the access, which now meets the default action.
        ::signal(SIGBUS, SIG_DFL);
    }
}

} // namespace xshard::detail

