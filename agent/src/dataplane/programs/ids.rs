//! What a kernel program id stands for: the loaded program's info and
//! name, found by walking every loaded program (which needs
//! CAP_SYS_ADMIN). The loader and the pinned generations both ask.

/// The loaded program with kernel id `id`.
pub(crate) fn program_info(id: u32) -> Option<aya::programs::ProgramInfo> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
}

/// The name of the loaded program with kernel id `id`.
pub(crate) fn program_name(id: u32) -> Option<String> {
    program_info(id).and_then(|p| p.name_as_str().map(str::to_string))
}
