//! The operator's images (SPEC §26): `OPKERNEL_IMAGES` names each image a
//! run may be created with (`python=opkernel-sandbox:debian;base=...`);
//! `OPKERNEL_IMAGE` stays the image of runs that name none.

/// One image the operator allows, by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedImage {
    /// Its name (`[a-z0-9_.-]{1,64}`), what a run asks for.
    pub name: String,
    /// The Docker reference containers are made from.
    pub reference: String,
}

/// The images runs may use: the listed ones, and the default.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    /// Every allowed image, the default's entry included, in listed order.
    pub list: Vec<NamedImage>,
    /// The name of the image of runs that name none.
    pub default: String,
}

/// The name the default image has when `OPKERNEL_IMAGES` does not list
/// its reference under a name of its own.
pub const DEFAULT_NAME: &str = "default";

/// Checks an image name: `[a-z0-9_.-]{1,64}`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "an image name matches [a-z0-9_.-]{{1,64}}, got {:?}",
            name.chars().take(80).collect::<String>()
        ))
    }
}

impl Images {
    /// `listed` (`NAME=REFERENCE` pairs, `;`-separated) and the default
    /// image's reference: the default keeps the name the list gives its
    /// reference, else it is listed as `default`.
    pub fn parse(listed: &str, default_reference: &str) -> Result<Images, String> {
        let mut list: Vec<NamedImage> = Vec::new();
        for entry in listed.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, reference) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?} is not NAME=REFERENCE"))?;
            let (name, reference) = (name.trim(), reference.trim());
            check_name(name)?;
            if reference.is_empty() || reference.contains(char::is_whitespace) {
                return Err(format!(
                    "image {name} has no valid reference: {reference:?}"
                ));
            }
            if list.iter().any(|i| i.name == name) {
                return Err(format!("image {name} is listed twice"));
            }
            list.push(NamedImage {
                name: name.to_owned(),
                reference: reference.to_owned(),
            });
        }
        let default = match list.iter().find(|i| i.reference == default_reference) {
            Some(i) => i.name.clone(),
            None if list.iter().any(|i| i.name == DEFAULT_NAME) => {
                return Err(format!(
                    "the name {DEFAULT_NAME:?} is listed for another image than OPKERNEL_IMAGE ({default_reference})"
                ))
            }
            None => {
                list.insert(
                    0,
                    NamedImage {
                        name: DEFAULT_NAME.to_owned(),
                        reference: default_reference.to_owned(),
                    },
                );
                DEFAULT_NAME.to_owned()
            }
        };
        Ok(Images { list, default })
    }

    /// The reference of the image called `name`.
    pub fn reference(&self, name: &str) -> Option<&str> {
        self.list
            .iter()
            .find(|i| i.name == name)
            .map(|i| i.reference.as_str())
    }

    /// Every name, in listed order (for messages and `GET /v1/images`).
    pub fn names(&self) -> Vec<String> {
        self.list.iter().map(|i| i.name.clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_keeps_its_listed_name_or_is_called_default() {
        let i = Images::parse("py=img:debian; base = img:latest", "img:latest").unwrap();
        assert_eq!(i.default, "base");
        assert_eq!(i.names(), ["py", "base"]);
        assert_eq!(i.reference("py"), Some("img:debian"));
        let i = Images::parse("py=img:debian", "img:latest").unwrap();
        assert_eq!(i.default, DEFAULT_NAME);
        assert_eq!(i.names(), ["default", "py"]);
        assert_eq!(Images::parse("", "x").unwrap().names(), ["default"]);
        for bad in ["py", "Py=x", "py=", "py=a;py=b", "default=other", "a b=x"] {
            assert!(Images::parse(bad, "img:latest").is_err(), "{bad}");
        }
    }
}
