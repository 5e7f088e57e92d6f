//! What a binary links at run time, read from `readelf`'s output: shared by `dist` (its binary
//! must be static) and `image` (a dynamic binary brings its shared objects into the image).

/// The program interpreter and the `NEEDED` shared objects in `readelf --program-headers
/// --dynamic --wide` output.
pub fn dynamic_needs(readelf: &str) -> Vec<String> {
    let mut needs = Vec::new();
    for line in readelf.lines() {
        let bracketed = |prefix: &str| {
            line.split_once(prefix).and_then(|(_, rest)| rest.split_once(']')).map(|(name, _)| name.trim().to_owned())
        };
        if let Some(interpreter) = bracketed("[Requesting program interpreter:") {
            needs.push(interpreter);
        } else if line.contains("(NEEDED)")
            && let Some(library) = bracketed("Shared library: [")
        {
            needs.push(library);
        }
    }
    needs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_binary_names_its_loader_and_libraries() {
        let readelf = "\
Program Headers:
  Type           Offset   VirtAddr           PhysAddr           FileSiz  MemSiz   Flg Align
  INTERP         0x000318 0x0000000000000318 0x0000000000000318 0x00001c 0x00001c R   0x1
      [Requesting program interpreter: /lib64/ld-linux-x86-64.so.2]
Dynamic section at offset 0x2dc8 contains 27 entries:
  Tag        Type                         Name/Value
 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x000000000000000c (INIT)               0x1000
";
        assert_eq!(dynamic_needs(readelf), ["/lib64/ld-linux-x86-64.so.2", "libgcc_s.so.1", "libc.so.6"]);
    }

    #[test]
    fn a_static_pie_needs_nothing() {
        // A static-pie has a dynamic section (for its own relocations) but no interpreter or NEEDED.
        let readelf = "\
Program Headers:
  Type           Offset   VirtAddr           PhysAddr           FileSiz  MemSiz   Flg Align
  LOAD           0x000000 0x0000000000000000 0x0000000000000000 0x0a1b2c 0x0a1b2c R   0x1000
  DYNAMIC        0x1d2e48 0x00000000001d3e48 0x00000000001d3e48 0x0001a0 0x0001a0 RW  0x8
Dynamic section at offset 0x1d2e48 contains 22 entries:
  Tag        Type                         Name/Value
 0x000000000000001e (FLAGS)              BIND_NOW
 0x000000006ffffffb (FLAGS_1)            Flags: NOW PIE
";
        assert_eq!(dynamic_needs(readelf), Vec::<String>::new());
    }
}
