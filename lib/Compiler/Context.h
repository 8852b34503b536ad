// SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
//
// What the compiler library's parts share: one-time registration, the
// context every module is parsed in, and diagnostics collected as text.
//
#ifndef MOK_LIB_COMPILER_CONTEXT_H
#define MOK_LIB_COMPILER_CONTEXT_H

#include "mok/InitAllDialects.h"
#include "mok/InitAllPasses.h"

#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Target/LLVMIR/Dialect/Builtin/BuiltinToLLVMIRTranslation.h"
#include "mlir/Target/LLVMIR/Dialect/LLVMIR/LLVMToLLVMIRTranslation.h"

#include <memory>
#include <mutex>
#include <string>

namespace mok::detail {

/// Passes and pipelines are registered once per process, for parsing
/// pipeline strings.
inline void registerOnce() {
  static std::once_flag flag;
  std::call_once(flag, [] { mok::registerAllPasses(); });
}

/// Collects every diagnostic reported while it lives, as text with locations.
class DiagnosticCollector {
public:
  explicit DiagnosticCollector(mlir::MLIRContext *ctx)
      : handler(ctx, [this](mlir::Diagnostic &diag) {
          llvm::raw_string_ostream os(text);
          os << location(diag.getLocation()) << ": " << severity(diag) << diag
             << "\n";
          for (mlir::Diagnostic &note : diag.getNotes())
            os << location(note.getLocation()) << ": note: " << note << "\n";
          return mlir::success();
        }) {}
  std::string take(const char *fallback) {
    return text.empty() ? std::string(fallback) : std::move(text);
  }

private:
  /// file:line:col, as compilers print it, when the location has one.
  static std::string location(mlir::Location loc) {
    std::string s;
    llvm::raw_string_ostream os(s);
    if (auto flc = mlir::dyn_cast<mlir::FileLineColLoc>(loc))
      os << flc.getFilename().getValue() << ":" << flc.getLine() << ":"
         << flc.getColumn();
    else if (auto fused = mlir::dyn_cast<mlir::FusedLoc>(loc);
             fused && !fused.getLocations().empty())
      return location(fused.getLocations().front());
    else
      os << loc;
    return s;
  }
  static const char *severity(mlir::Diagnostic &d) {
    switch (d.getSeverity()) {
    case mlir::DiagnosticSeverity::Error:
      return "error: ";
    case mlir::DiagnosticSeverity::Warning:
      return "warning: ";
    case mlir::DiagnosticSeverity::Remark:
      return "remark: ";
    default:
      return "note: ";
    }
  }
  std::string text;
  mlir::ScopedDiagnosticHandler handler;
};

inline std::unique_ptr<mlir::MLIRContext> makeContext() {
  mlir::DialectRegistry registry;
  mok::registerAllDialects(registry);
  mlir::registerBuiltinDialectTranslation(registry);
  mlir::registerLLVMDialectTranslation(registry);
  auto ctx = std::make_unique<mlir::MLIRContext>(registry);
  ctx->loadAllAvailableDialects();
  // Diagnostics name their op, not the whole module.
  ctx->printOpOnDiagnostic(false);
  return ctx;
}

} // namespace mok::detail

#endif // MOK_LIB_COMPILER_CONTEXT_H
